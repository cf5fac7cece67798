"""Every case of a benchmark on one rank (collective): each row built, its entries timed side by side;
and a peer's cases in a process group of its own."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from ..measure import error_text
from .case import BenchConfig, Case, case_text
from .entries import dispatch_entry, peer_entry, variant_entry
from .form import bench_form, op_named
from .rows import progress_line
from .timing import RowTimings
from .tuned import Tuned


def peer_rank(ctx: Any, cfg: BenchConfig, name: str, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """The peer ``name`` for ``cases`` in a process group of its own: timed alone (``Peer.alone``), else
    side by side with ``bsp`` (both reported; the row's speedups use the main group's BSP forms)."""
    ctx.heap_size = cfg.heap_gib << 30
    out_rows = []
    for case in cases:
        op = op_named(case.op)
        peer = bench_form(op).peers[name]
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        timings = RowTimings()
        base = None
        if not peer.alone:
            bsp = op.baseline()
            ws = bsp.prepare(key, {}, ctx)
            out = op.empty_output(key, ctx.device)
            base = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=out), cfg.link(inputs[0], out))
        entry = peer_entry(peer, op, key, ctx, inputs, cfg, timings)
        timings.run(ctx, cfg)
        beside = base is not None and "error" not in entry
        out_rows.append({**entry, "bsp_same_group": base} if beside else entry)
    return out_rows


def apart(peer: Any, names: Iterable[str]) -> bool:
    """Whether ``peer`` runs in a process group of its own for a row timing the variants ``names``
    (always when ``alone``; else when a form of ``peer.apart_from`` is among them)."""
    return peer.alone or bool(peer.apart_from & set(names))


def _runtime(cfg: BenchConfig, ctx: Any) -> tuple[Any, str | None]:
    """A dispatch runtime on this rank's device (collective), or the error that prevented it."""
    from ..runtime.dispatch import Runtime, RuntimeConfig

    try:
        rt = Runtime(
            RuntimeConfig(
                heap_size=ctx.heap_size,
                tables=cfg.tables,
                db_url=cfg.db_url,
                persist_misses=False,
                timing=cfg.dispatch_timing,
            )
        )
        rt.load(ctx.device)
        return rt, None
    except Exception as exc:
        return None, error_text(exc)


def _timed_variants(
    op: Any, available: Mapping[str, Any], selected: tuple[str, ...] | None, ws: int
) -> list[str]:
    """The variants a row times besides ``bsp``: ``selected`` (else those of the tuner's default space at
    world size ``ws``), and the BSP forms always (every speedup is against the fastest of them)."""
    names = [n for n, v in available.items() if not v.is_baseline]
    if selected is not None:
        return [n for n in names if n in selected or available[n].bsp_form]
    return [n for n in names if op.in_default_space(n, ws)]


def row_variants(op_name: str, target: Any, selected: tuple[str, ...] | None, world_size: int) -> list[str]:
    """The variants a row of ``op_name`` times on ``target`` besides ``bsp`` (see :func:`_timed_variants`)."""
    op = op_named(op_name)
    return _timed_variants(op, op.available_variants(target), selected, world_size)


def bench_rank(ctx: Any, cfg: BenchConfig, tuned: Tuned) -> list[dict[str, Any]]:
    """Every case of ``cfg`` on this rank (collective); the rows (identical on every rank)."""
    ctx.heap_size = cfg.heap_gib << 30
    rt, rt_error = _runtime(cfg, ctx) if cfg.dispatch else (None, None)
    rows = []
    for i, case in enumerate(cfg.cases):
        row_start = time.monotonic()
        if ctx.rank == 0:  # progress on stderr: stdout may carry the JSON report
            print(f"[{i + 1}/{len(cfg.cases)}] {case_text(case)} ...", file=sys.stderr, flush=True)
        op = op_named(case.op)
        form = bench_form(op)
        available = op.available_variants(ctx.target)
        names = _timed_variants(op, available, cfg.variants, ctx.world_size)
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        row: dict[str, Any] = case.row()
        try:
            op.validate(key)
        except ValueError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        bsp = op.baseline()
        ws = bsp.prepare(key, {}, ctx)
        out = op.empty_output(key, ctx.device)
        timings = RowTimings()  # every entry of the row, timed side by side once all are ready
        row["bsp"] = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=out), cfg.link(inputs[0], out))
        parts = form.parts(key, ctx, inputs, ws)  # the pieces of BSP alone: communication first
        row["parts"] = list(parts)
        for name, fn in parts.items():
            row[name] = timings.add({}, fn)
        row["variants"] = {
            n: variant_entry(op, available[n], key, ctx, inputs, cfg, tuned.get(i, {}).get(n), timings)
            for n in names
        }
        row["bsp_forms"] = ["bsp", *(n for n in names if available[n].bsp_form)]
        if cfg.dispatch:
            row["dispatch"] = (
                {"error": rt_error} if rt is None else dispatch_entry(rt, op, key, ctx, inputs, cfg, timings)
            )
        for name, peer in form.peers.items() if cfg.peers else ():
            if not peer.applies(key):
                continue
            if ctx.target.device_type not in peer.device_types:
                row[name] = {"skipped": f"needs {' or '.join(sorted(peer.device_types)).upper()}"}
            elif not apart(peer, names):  # else in a process group of its own, after this one
                row[name] = peer_entry(peer, op, key, ctx, inputs, cfg, timings)
        timings.run(ctx, cfg)
        rows.append(row)
        if ctx.rank == 0:
            took = f"({time.monotonic() - row_start:.1f} s)"
            print(f"      {progress_line(row)} {took}", file=sys.stderr, flush=True)
            if cfg.progress_path is not None:
                with open(cfg.progress_path, "a") as f:
                    f.write(json.dumps(row, default=str) + "\n")
    if rt is not None:
        rt.close()
    return rows
