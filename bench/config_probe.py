"""Named ag_gemm configurations side by side with BSP on 2 GPUs (or --world-size), in one run.

For each shape (N, K), layout and M: BSP (eager and CUDA-graph timed), then every configuration of
``--configs`` (a JSON file ``{"variant": [params, ...], ...}``) that the variant accepts for that
problem, and with ``--table`` the table's record for the problem: each checked against the fp32
reference (NaN-poisoned output, two fresh seeds), then all of them and BSP timed side by side
(``autotaxer.measure.time_interleaved``: one sample of each in turn). For probing a
change before it goes into a variant's seeds or search space; the tuner and ``ag_gemm_bench.py`` stay
the record of what ships. The all-gather alone (NCCL) and cuBLAS alone on the gathered A are timed in the
same rounds (the ceiling), and with ``--producers`` each ``push``/``pull`` configuration's producer steps
alone too (the same kernel launched with ``phase="producers"``: every program's, or the dedicated
producers', stores and flag releases, no GEMM; in rounds of their own after the rest, since such a launch
raises the next call's flags early), which tells the transfer's own time apart from what the GEMM hides
of it. Writes JSON and prints one line per timed configuration.

    python bench/config_probe.py --configs probe.json --shapes 8192x8192 --m 256,512 --out probe_out.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from typing import Any

from autotaxer.benchmark import BenchConfig, Case, RowTimings, environment, write_json
from autotaxer.measure import error_text

Entry = tuple[str, str, dict]  # (variant, source, params)


def _entries(op, key, target, configs: dict[str, list[dict]], table: list[dict]) -> list[Entry]:
    """``(variant, source, params)`` to time for ``key``: the table's record, then the accepted configs."""
    out = []
    for rec in table:
        if (
            rec.get("op") == "ag_gemm"
            and rec.get("world_size") == key.world_size
            and rec.get("dtype") == key.dtype
            and rec.get("shape") == dict(key.shape)
            and rec.get("layout") == dict(key.layout)
            and rec.get("variant") != "bsp"
        ):
            out.append((rec["variant"], "table", dict(rec["params"])))
    for name, params_list in configs.items():
        variant = op.variants.get(name)
        for params in params_list:
            if variant is not None and variant.check(key, target, params) is None:
                out.append((name, "probe", dict(params)))
    return out


def _producers(ws: Any, inputs: tuple, ctx: Any, out: Any) -> None:
    """The producer steps of a ``push``/``pull`` workspace's kernel alone (``phase="producers"``)."""
    a_shard, b = inputs
    buf = ws.buffers
    buf["launch"](
        a_shard=a_shard, b=b, out=out, inbox=buf["data"], flags=buf["flags"], sync=buf["sync"],
        heap_bases=buf["heap_bases"], rank=ctx.rank, world_size=ctx.world_size,
        gather_dim=ws.key["gather_dim"], config=buf["config"], num_sms=ctx.target.num_sms, phase="producers",
    )  # fmt: skip


def probe_rank(
    ctx: Any, cfg: BenchConfig, configs: dict[str, list[dict]], table: list[dict], producers: bool = False
) -> list[dict]:
    """Every case of ``cfg`` on this rank (collective); the rows (identical on every rank)."""
    import torch

    from autotaxer._problem import torch_dtype
    from autotaxer.measure import check_variant
    from autotaxer.ops import get_op
    from autotaxer.ops.ag_gemm.bsp import all_gather_shards

    ctx.heap_size = cfg.heap_gib << 30
    op = get_op("ag_gemm")
    rows = []
    for case in cfg.cases:
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        bsp = op.baseline()
        ws = bsp.prepare(key, {}, ctx)
        out = op.empty_output(key, ctx.device)
        row: dict[str, Any] = dict(case.__dict__)
        timings = RowTimings()  # BSP and every accepted configuration, timed side by side
        row["bsp"] = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=out))
        row["allgather"] = timings.add({}, partial(all_gather_shards, inputs[0], ws.buffers["gathered"], ctx))
        a_full = torch.randn((case.M, case.K), device=ctx.device).to(torch_dtype(case.dtype))
        row["gemm"] = timings.add(
            {}, partial(torch.matmul, a_full, inputs[1], out=op.empty_output(key, ctx.device))
        )
        timed = []
        alone = []  # (entry, producer steps of its workspace): timed after the rest
        for name, source, params in _entries(op, key, ctx.target, configs, table):
            entry: dict[str, Any] = {"variant": name, "source": source, "params": params}
            variant = op.variants[name]
            try:
                vws = variant.prepare(key, params, ctx)
                entry["err"] = check_variant(op, variant, key, params, ctx, cfg.seed, ws=vws)
                if entry["err"] <= op.tolerance(key):
                    vout = op.empty_output(key, ctx.device)
                    timings.add(entry, partial(variant.run, vws, inputs, ctx, out=vout))
                    if producers and name in ("push", "pull"):
                        alone.append((entry, partial(_producers, vws, inputs, ctx, vout)))
                else:
                    entry["error"] = f"relative error {entry['err']:.3g}"
            except Exception as exc:
                entry["error"] = error_text(exc)
            timed.append(entry)
        timings.run(ctx, cfg)
        if alone:  # a producers-only launch raises the next call's flags early: never before a full call
            producer_timings = RowTimings()
            for entry, fn in alone:
                entry["producers"] = producer_timings.add({}, fn)
            producer_timings.run(ctx, cfg)
        row["entries"] = timed
        rows.append(row)
        if ctx.rank == 0:
            for entry in timed:
                print(_line(row, entry), flush=True)
    return rows


def _line(row: dict, entry: dict) -> str:
    def us(v: Any) -> str:
        return f"{v:8.1f}" if isinstance(v, float) else "       -"

    head = f"{row['N']:>5} {row['K']:>5} gd{row['gather_dim']} M={row['M']:<5}"
    bsp = row["bsp"]
    body = f"bsp {us(bsp.get('eager'))} {us(bsp.get('graph'))} | {entry['variant']:<11} {entry['source']:<5}"
    times = f"{us(entry.get('eager'))} {us(entry.get('graph'))}"
    if "producers" in entry:
        times += f" (producers alone {us(entry['producers'].get('graph'))})"
    result = entry.get("error") or f"{times} err {entry.get('err', 0):.1e}"
    return f"{head} {body} {result} {json.dumps(entry['params'], separators=(',', ':'))}"


def main(argv: list[str] | None = None) -> None:
    from autotaxer.testing import run_ranks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", required=True, help='JSON file {"variant": [params, ...]}')
    p.add_argument("--table", default=None, help="a table file (autotaxer export): time its record too")
    p.add_argument("--shapes", default="8192x8192", help="comma list of NxK")
    p.add_argument("--m", required=True, help="comma list of M values")
    p.add_argument("--layouts", default="0,1", help="gather_dim values, comma list")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--samples", type=int, default=9)
    p.add_argument("--producers", action="store_true", help="push/pull: time the producer steps alone too")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    with open(a.configs) as f:
        configs = json.load(f)
    if not isinstance(configs, dict) or not all(isinstance(v, list) for v in configs.values()):
        p.error(f"--configs {a.configs}: expected an object of variant -> list of params")
    table = []
    if a.table:
        with open(a.table) as f:
            table = json.load(f)["records"]
    cases = tuple(
        Case(M=m, N=int(n), K=int(k), gather_dim=gd)
        for n, k in (s.lower().split("x") for s in a.shapes.split(","))
        for gd in (int(x) for x in a.layouts.split(","))
        for m in (int(x) for x in a.m.split(","))
    )
    cfg = BenchConfig(
        cases=cases, world_size=a.world_size, device=a.device, iters=a.iters, samples=a.samples, peers=False
    )
    cfg.validate()
    timeout = 120 + 120 * len(cases)
    rows = run_ranks(
        probe_rank, a.world_size, a.device, args=(cfg, configs, table, a.producers), timeout=timeout
    )
    report = {**environment(a.device), "world_size": a.world_size, "configs": configs, "rows": rows[0]}
    write_json(report, a.out)


if __name__ == "__main__":
    main()
