"""Side-by-side benchmark of an op: BSP, its parts, every variant, dispatch and the peers, in one run.

For each case (an op's shape, layout and dtype) on ``world_size`` spawned ranks: BSP, the parts BSP is
made of timed alone (e.g. the all-gather alone and the GEMM alone: the ceiling of any fused kernel is the
slowest of them), every available variant at its tuned configuration (the best COMPLETE trial of that
variant in the case's Optuna study; a capped sweep of its search space where the database has none),
``dispatch()`` as a user would call it, and the op's peers (implementations outside autotaxer, e.g.
PyTorch's fused op; one that may hang, e.g. Iris' stock kernel, in its own process group with a time
limit so a hang is reported, not fatal). What an op adds to a row (its parts and peers) is its ``bench``
integration (:class:`autotaxer.ops._forms.BenchForm`). Every configuration is validated against the fp32
reference before it is timed. A row's entries are timed side by side with
:func:`autotaxer.measure.time_interleaved` once all are ready: ``eager`` (calls in a row) and, on
CUDA, ``graph`` (calls captured in one CUDA graph), one sample of each entry in turn, so a slow stretch of
the machine falls on all of them alike; median of the samples, max across ranks, microseconds. As in the
tuner, each call of BSP, a variant, dispatch or a peer waits for the previous call's output
(``chain="dependent"``, the link's cost subtracted and kept as ``eager_link``/``graph_link``); the parts
(one collective or one GEMM on the current stream) run back to back. Peers in a process group of their
own run afterwards. (A variant without a tuned configuration first picks the best
of its capped sweep by eager time, one configuration after another.)

Torch, Triton and Iris are imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from ._problem import DTYPES, ProblemKey
from .measure import error_text

UNITS = (
    "microseconds per call, median, max over ranks; eager = calls in a row, graph = CUDA graph; "
    "config.chain = dependent: each call waits for the previous one's output (link cost subtracted)"
)
#: The sign of a speedup in every printed line (``×1.25``), as ``tune`` and ``show`` print it.
SPEEDUP = "×"
DEVICES = ("cuda", "cpu")
#: What rows written before rows named each op's own layout field called the op's dimension.
LEGACY_DIM = "gather_dim"


def _op(name: str) -> Any:
    from .ops import get_op

    return get_op(name)


def _bench_form(op: Any) -> Any:
    """The ``bench`` integration of ``op``; ``ValueError`` naming the ops that have one."""
    from .integrations import form as integration_form

    form = integration_form(op, "bench")
    if form is None:
        from .ops import ops_with

        names = ", ".join(o.name for o in ops_with("bench"))
        raise ValueError(f"op: bench does not run {op.name} (it runs {names})")
    return form


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: the op, its shape and layout fields (as a shapes file names them) and
    the dtype; :meth:`of` builds one from field values."""

    op: str
    shape: tuple[tuple[str, int], ...]
    layout: tuple[tuple[str, Any], ...] = ()
    dtype: str = "bf16"

    @classmethod
    def of(cls, op: str, dtype: str = "bf16", **fields: Any) -> Case:
        """The case of ``op`` with these shape and layout fields (unnamed layout fields: their defaults);
        ``ValueError`` naming a field the op does not have or a missing shape field."""
        opobj = _op(op)
        unknown = [f for f in fields if f not in opobj.shape_fields and f not in opobj.layout_choices]
        if unknown:
            raise ValueError(f"{unknown[0]}: not a field of op {op!r}")
        missing = [f for f in opobj.shape_fields if f not in fields]
        if missing:
            raise ValueError(f"{missing[0]}: missing (op {op!r} needs {','.join(opobj.shape_fields)})")
        layout = {**opobj.layout_defaults(), **{f: v for f, v in fields.items() if f in opobj.layout_choices}}
        return cls(op, tuple((f, fields[f]) for f in opobj.shape_fields), tuple(layout.items()), dtype)

    def key(self, gpu_model: str, world_size: int) -> ProblemKey:
        """The problem key of this case on ``gpu_model`` with ``world_size`` ranks."""
        shape, layout = dict(self.shape), dict(self.layout)
        return ProblemKey.make(self.op, gpu_model, world_size, self.dtype, shape, layout)

    def row(self) -> dict[str, Any]:
        """The fields a result row starts with: ``op``, the shape and layout fields, ``dtype``."""
        return {"op": self.op, **dict(self.shape), **dict(self.layout), "dtype": self.dtype}

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r} (expected one of {', '.join(DTYPES)})")
        opobj = _op(self.op)
        _bench_form(opobj)
        for f, v in self.shape:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{f}: must be a positive integer, got {v!r}")
        for f, v in self.layout:
            choices = opobj.layout_choices.get(f)
            if choices is None or v not in choices:
                allowed = ", ".join(str(c) for c in choices or ())
                raise ValueError(f"{f}: must be one of {allowed}, got {v!r}")


@dataclass(frozen=True)
class BenchConfig:
    """What to run; frozen so every rank gets the same plan.

    ``variants``: None = every available non-baseline variant of the tuner's default space. ``max_configs``:
    configurations swept per variant that has no tuned configuration. ``db_url``/``tables``: where tuned
    configurations and dispatch's table come from (None/empty: dispatch's defaults); ``dispatch_timing``
    is dispatch's ``RuntimeConfig.timing`` (only winners tuned that way). ``progress_path``:
    rank 0 appends each finished row there as one JSON line, so a run cut short keeps what it measured.
    ``chain``: ``dependent`` (each call waits for the previous one's output) or ``back-to-back``.
    """

    def link(self, feeds: Any, out: Any = None) -> Any:
        """The :class:`autotaxer.measure.Chain` of an entry reading ``feeds`` (None: back to back)."""
        from .measure import Chain

        return Chain(feeds, out) if self.chain == "dependent" else None

    cases: tuple[Case, ...]
    world_size: int = 2
    device: str = "cuda"
    variants: tuple[str, ...] | None = None
    max_configs: int = 8
    warmup: int = 5
    iters: int = 20
    samples: int = 9
    peers: bool = True
    dispatch: bool = True
    db_url: str | None = None
    tables: tuple[str, ...] = ()
    heap_gib: int = 8
    peer_timeout: float = 180.0
    seed: int = 1234
    progress_path: str | None = None
    dispatch_timing: str | None = None
    chain: str = "dependent"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        from .measure import CHAINS

        if not self.cases:
            raise ValueError("cases: nothing to benchmark")
        if self.chain not in CHAINS:
            raise ValueError(f"chain: expected one of {', '.join(CHAINS)}, got {self.chain!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {self.world_size}")
        if self.device not in DEVICES:
            raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        for name, low in (("max_configs", 1), ("warmup", 0), ("iters", 1), ("samples", 1), ("heap_gib", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: must be >= {low}, got {getattr(self, name)}")
        if not self.peer_timeout > 0:
            raise ValueError(f"peer_timeout: must be > 0 seconds, got {self.peer_timeout}")
        if self.dispatch_timing not in (None, "eager", "graph"):
            raise ValueError(f"dispatch_timing: expected eager, graph or None, got {self.dispatch_timing!r}")
        for c in self.cases:
            c.validate()

    @property
    def modes(self) -> tuple[str, ...]:
        """Timing modes: eager and CUDA graph on GPUs, eager only on CPU."""
        return ("eager", "graph") if self.device == "cuda" else ("eager",)


#: Tuned configurations: case index -> variant name -> params.
Tuned = Mapping[int, Mapping[str, Mapping[str, Any]]]


def cases_from_shapes(rows: Iterable[Any]) -> tuple[Case, ...]:
    """Cases of the rows of a shapes file (:class:`autotaxer.shapes.ShapeRow`) whose op ``bench`` runs
    (its ``bench`` integration); the others are left out."""
    from .ops import ops_with

    names = {op.name for op in ops_with("bench")}
    return tuple(Case.of(r.op, r.dtype, **r.shape, **r.layout) for r in rows if r.op in names)


# -- tuned configurations from the database -----------------------------------------------------------


def tuned_params(db: Any, cases: Iterable[Case], gpu_model: str, world_size: int) -> dict[int, dict]:
    """Per case, each variant's best COMPLETE trial in its Optuna study, and the stored winner.

    ``db`` is an open :class:`autotaxer.storage.Database`. Cases without a study or winner are absent.
    """
    import optuna

    from .tuner.study import best_trial, split_params

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = db.optuna_storage()
    names = set(optuna.get_all_study_names(storage)) if storage is not None else set()
    out: dict[int, dict] = {}
    for i, case in enumerate(cases):
        key = case.key(gpu_model, world_size)
        found: dict[str, dict] = {}
        if key.text in names:
            study = optuna.load_study(study_name=key.text, storage=storage)
            for variant in {t.params.get("variant") for t in study.get_trials(deepcopy=False)} - {None}:
                best = best_trial(study, variant)
                if best is not None:
                    found[variant] = split_params(best.params)[1]
        winner = db.get_winner(key)
        if winner is not None:
            found.setdefault(winner.variant, dict(winner.params))
        if found:
            out[i] = found
    return out


# -- per-rank work ------------------------------------------------------------------------------------


class RowTimings:
    """The entries of one row waiting to be timed side by side.

    ``add`` registers an entry (its result dict) with the callable to time and its chain (None: back to
    back); ``run`` times them all with :func:`autotaxer.measure.time_interleaved` (one sample of each in
    turn, every mode of ``cfg``) and writes each one's times into its dict. Collective.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[dict[str, Any], Callable[[], Any], Any]] = []

    def add(self, entry: dict[str, Any], fn: Callable[[], Any], chain: Any = None) -> dict[str, Any]:
        """Time ``fn`` into ``entry`` at the next :meth:`run`, its calls linked by ``chain`` (a
        :class:`autotaxer.measure.Chain`, or None); returns ``entry``."""
        self._pending.append((entry, fn, chain))
        return entry

    def run(self, ctx: Any, cfg: BenchConfig) -> None:
        """Time every registered entry (collective); afterwards none is pending."""
        from .measure import time_interleaved

        if not self._pending:
            return
        fns = [fn for _, fn, _ in self._pending]
        chains = [chain for _, _, chain in self._pending]
        times = time_interleaved(
            fns, ctx, cfg.modes, warmup=cfg.warmup, iters=cfg.iters, samples=cfg.samples, chains=chains
        )
        for (entry, _, _), t in zip(self._pending, times, strict=True):
            entry.update(t)
        self._pending.clear()


def capped(configs: list[dict], cap: int) -> list[dict]:
    """At most ``cap`` configs, spread evenly over the list (first and last kept)."""
    if len(configs) <= cap:
        return configs
    step = (len(configs) - 1) / (cap - 1) if cap > 1 else 0
    return [configs[round(i * step)] for i in range(cap)]


def _variant_entry(
    op, variant, key, ctx, inputs, cfg: BenchConfig, tuned: Mapping | None, timings: RowTimings
) -> dict[str, Any]:
    """``variant`` at its tuned configuration, or at the best (eager) of a capped sweep, registered with
    ``timings`` for the row's side-by-side timing."""
    from .measure import check_variant, time_variant
    from .ops import iter_grid

    result: dict[str, Any] = {}
    configs: list[dict] = []
    if tuned is not None:
        reason = variant.check(key, ctx.target, tuned)
        if reason is None:
            configs, result["source"] = [dict(tuned)], "tuned"
        else:
            result["tuned_rejected"] = f"{dict(tuned)}: {reason}"
    if not configs:
        space = variant.search_space(key, ctx.target)
        valid = [p for p in iter_grid(space) if variant.check(key, ctx.target, p) is None]
        seeds = [p for p in variant.seed_configs(key, ctx.target) if p in valid][: cfg.max_configs]
        rest = [p for p in valid if p not in seeds]
        configs = (
            seeds + capped(rest, cfg.max_configs - len(seeds)) if len(seeds) < cfg.max_configs else seeds
        )
        result["source"] = "sweep"
        result["valid_configs"] = len(valid)
        result["seeded"] = len(seeds)
    tried, failed = [], []
    best: tuple[float, dict, Any, Any, float] | None = None
    for params in configs:
        try:
            ws = variant.prepare(key, params, ctx)
            err = check_variant(op, variant, key, params, ctx, cfg.seed, ws=ws)
            if not err <= op.tolerance(key):
                failed.append({"params": params, "error": f"relative error {err:.3g}"})
                continue
            out = op.empty_output(key, ctx.device)
            fn = partial(variant.run, ws, inputs, ctx, out=out)
            t = time_variant(
                fn, ctx, cfg.warmup, cfg.iters, "eager", cfg.samples, chain=cfg.link(inputs[0], out)
            )
            tried.append({"params": params, "eager": t, "err": err})
            if best is None or t < best[0]:
                best = (t, params, ws, out, err)
        except Exception as exc:
            failed.append({"params": params, "error": error_text(exc)})
    result.update(tried=tried, failed=failed)
    if best is not None:
        _, params, ws, out, err = best
        result.update(best_params=params, err=err)
        timings.add(result, partial(variant.run, ws, inputs, ctx, out=out), cfg.link(inputs[0], out))
    return result


def _dispatch_entry(rt, op, key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict[str, Any]:
    """``dispatch`` as a user calls it (its plan created by an untimed first call), registered with
    ``timings``."""
    from .ops import relative_error

    layout = {f: key[f] for f in op.call_layout()}
    try:
        plan = rt.plan(key.op, *inputs, **layout)
        out = op.empty_output(key, ctx.device)
        got = rt.dispatch(key.op, *inputs, out=out, **layout)
        got = out if got is None else got
        err = relative_error(got, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        d = plan.decision
        entry = {"variant": d.variant, "params": dict(d.params), "source": d.source, "err": err}
        if d.tuned_key is not None:
            entry["tuned_key"] = d.tuned_key.text
        if not err <= op.tolerance(key):
            entry["error"] = f"relative error {err:.3g}"
            return entry
        fn = partial(rt.dispatch, key.op, *inputs, out=out, **layout)
        return timings.add(entry, fn, cfg.link(inputs[0], out))
    except Exception as exc:
        return {"error": error_text(exc)}


def _peer_entry(peer: Any, op: Any, key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict:
    """The peer ``peer`` (:class:`autotaxer.ops._forms.Peer`) on this row's inputs, checked against the
    reference and registered with ``timings``."""
    if ctx.target.device_type not in peer.device_types:
        return {"skipped": f"needs {' or '.join(sorted(peer.device_types)).upper()}"}
    from .ops import relative_error

    try:
        fn = peer.make(key, ctx, inputs)
        got = fn()
        if ctx.target.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
        err = relative_error(got, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        return timings.add({"err": err}, fn, cfg.link(inputs[0]))  # a peer returns its output
    except Exception as exc:
        return {"error": error_text(exc)}


def _peer_rank(ctx: Any, cfg: BenchConfig, name: str, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """The peer ``name`` for ``cases`` in a process group of its own: timed alone (``Peer.alone``), else
    side by side with ``bsp`` (both reported; the row's speedups use the main group's BSP forms)."""
    ctx.heap_size = cfg.heap_gib << 30
    out_rows = []
    for case in cases:
        op = _op(case.op)
        peer = _bench_form(op).peers[name]
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        timings = RowTimings()
        base = None
        if not peer.alone:
            bsp = op.baseline()
            ws = bsp.prepare(key, {}, ctx)
            out = op.empty_output(key, ctx.device)
            base = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=out), cfg.link(inputs[0], out))
        entry = _peer_entry(peer, op, key, ctx, inputs, cfg, timings)
        timings.run(ctx, cfg)
        beside = base is not None and "error" not in entry
        out_rows.append({**entry, "bsp_same_group": base} if beside else entry)
    return out_rows


def _apart(peer: Any, names: Iterable[str]) -> bool:
    """Whether ``peer`` runs in a process group of its own for a row timing the variants ``names``
    (always when ``alone``; else when a form of ``peer.apart_from`` is among them)."""
    return peer.alone or bool(peer.apart_from & set(names))


def _runtime(cfg: BenchConfig, ctx: Any) -> tuple[Any, str | None]:
    """A dispatch runtime on this rank's device (collective), or the error that prevented it."""
    from .runtime.dispatch import Runtime, RuntimeConfig

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


def _entries(op: Any, available: Mapping[str, Any], selected: tuple[str, ...] | None, ws: int) -> list[str]:
    """The variants a row times besides ``bsp``: ``selected`` (else those of the tuner's default space at
    world size ``ws``), and the BSP forms always (every speedup is against the fastest of them)."""
    names = [n for n, v in available.items() if not v.is_baseline]
    if selected is not None:
        return [n for n in names if n in selected or available[n].bsp_form]
    return [n for n in names if op.in_default_space(n, ws)]


def row_variants(op_name: str, target: Any, selected: tuple[str, ...] | None, world_size: int) -> list[str]:
    """The variants a row of ``op_name`` times on ``target`` besides ``bsp`` (see :func:`_entries`)."""
    from .ops import get_op

    op = get_op(op_name)
    return _entries(op, op.available_variants(target), selected, world_size)


def bench_rank(ctx: Any, cfg: BenchConfig, tuned: Tuned) -> list[dict[str, Any]]:
    """Every case of ``cfg`` on this rank (collective); the rows (identical on every rank)."""
    ctx.heap_size = cfg.heap_gib << 30
    rt, rt_error = _runtime(cfg, ctx) if cfg.dispatch else (None, None)
    rows = []
    for i, case in enumerate(cfg.cases):
        row_start = time.monotonic()
        if ctx.rank == 0:  # progress on stderr: stdout may carry the JSON report
            print(f"[{i + 1}/{len(cfg.cases)}] {case_text(case)} ...", file=sys.stderr, flush=True)
        op = _op(case.op)
        form = _bench_form(op)
        available = op.available_variants(ctx.target)
        names = _entries(op, available, cfg.variants, ctx.world_size)
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
            n: _variant_entry(op, available[n], key, ctx, inputs, cfg, tuned.get(i, {}).get(n), timings)
            for n in names
        }
        row["bsp_forms"] = ["bsp", *(n for n in names if available[n].bsp_form)]
        if cfg.dispatch:
            row["dispatch"] = (
                {"error": rt_error} if rt is None else _dispatch_entry(rt, op, key, ctx, inputs, cfg, timings)
            )
        for name, peer in form.peers.items() if cfg.peers else ():
            if not peer.applies(key):
                continue
            if ctx.target.device_type not in peer.device_types:
                row[name] = {"skipped": f"needs {' or '.join(sorted(peer.device_types)).upper()}"}
            elif not _apart(peer, names):  # else in a process group of its own, after this one
                row[name] = _peer_entry(peer, op, key, ctx, inputs, cfg, timings)
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


def case_text(case: Case) -> str:
    """``ag_gemm M=64 N=256 K=256 gather_dim=0 b_layout=kn fp32``: a case in one short line."""
    fields = " ".join(f"{f}={v}" for f, v in (*case.shape, *case.layout))
    return f"{case.op} {fields} {case.dtype}"


def peer_groups(cfg: BenchConfig, rows: list[Mapping[str, Any]]) -> list[tuple[str, tuple[Case, ...]]]:
    """``(peer, cases)`` of every process group of its own that the peers of ``rows`` need (a peer's
    cases split by its ``group_by``), in case order."""
    groups: dict[tuple[str, Any], list[Case]] = {}
    for case, row in zip(cfg.cases, rows, strict=True):
        if "error" in row:
            continue
        key = case.key("any", cfg.world_size)
        for name, peer in _bench_form(_op(case.op)).peers.items():
            measured = [*row.get("bsp_forms", ()), *(row.get("variants") or ())]
            if peer.applies(key) and _apart(peer, measured) and cfg.device in peer.device_types:
                groups.setdefault((name, peer.group_by(key)), []).append(case)
    return [(name, tuple(cases)) for (name, _), cases in groups.items()]


def _peer_group(name: str, cfg: BenchConfig, cases: tuple[Case, ...]) -> dict[Case, Any]:
    """The peer ``name`` on ``cfg.world_size`` fresh GPU ranks: its per-case entries. A group that hangs
    marks every case as timed out; one that raises is retried case by case, so one failing M does not
    hide the others."""
    from ._launch import RanksFailed, run_ranks

    if not cases:
        return {}
    timeout = cfg.peer_timeout
    try:
        rows = run_ranks(_peer_rank, cfg.world_size, cfg.device, args=(cfg, name, cases), timeout=timeout)
        return dict(zip(cases, rows[0], strict=True))
    except RanksFailed as exc:
        if "did not finish" in str(exc):
            return {c: {"error": f"timed out after {cfg.peer_timeout:.0f} s (hang?)"} for c in cases}
    result = {}
    for case in cases:
        try:
            args = (cfg, name, (case,))
            rows = run_ranks(_peer_rank, cfg.world_size, cfg.device, args=args, timeout=timeout)
            result[case] = rows[0][0]
        except RanksFailed as exc:
            result[case] = {"error": str(exc)[-400:]}
    return result


# -- the whole run ------------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    """Device name, GPU count and software versions, stored with every result file."""
    import torch

    from ._target import software_versions

    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "versions": software_versions(),
    }


def write_json(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``report`` atomically (a temporary file renamed over ``path``): never half-written."""
    from .output_file import write_atomic

    write_atomic(path, json.dumps(report, indent=1, default=str, allow_nan=True), make_folder=True)


def run_bench(
    cfg: BenchConfig,
    tuned: Tuned | None = None,
    out_path: str | os.PathLike[str] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Run every case of ``cfg`` on ``cfg.world_size`` spawned ranks; return (and write) the report.

    With ``out_path`` the JSON is written after the main run, and again after Iris' stock kernel (which
    may hang), so a hang loses nothing measured before it.
    """
    from ._launch import run_ranks

    cfg.validate()
    if cfg.progress_path is not None:  # a fresh progress log; rank 0 appends to it
        os.makedirs(os.path.dirname(os.path.abspath(cfg.progress_path)), exist_ok=True)
        open(cfg.progress_path, "w").close()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timeout = 120 + (90 if cfg.device == "cuda" else 30) * len(cfg.cases)
    rows = run_ranks(bench_rank, cfg.world_size, cfg.device, args=(cfg, dict(tuned or {})), timeout=timeout)[
        0
    ]
    report = {
        **environment(cfg.device),
        "world_size": cfg.world_size,
        "date": started,
        "command": command
        if command is not None
        else " ".join([os.path.basename(sys.executable), *sys.argv]),
        "config": {**asdict(cfg), "cases": [c.row() for c in cfg.cases]},
        "units": UNITS,
        "rows": rows,
    }
    if out_path is not None:
        write_json(report, out_path)
    if cfg.peers:
        for name, cases in peer_groups(cfg, rows):
            for case, entry in _peer_group(name, cfg, cases).items():
                rows[cfg.cases.index(case)][name] = entry
        if out_path is not None:
            write_json(report, out_path)
    return report


# -- reading results ----------------------------------------------------------------------------------


def best_us(entry: Mapping[str, Any] | None) -> float | None:
    """The faster of an entry's eager and graph times (µs), or None when it has neither."""
    if not entry:
        return None
    vals = [entry.get(m) for m in ("eager", "graph")]
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return min(vals) if vals else None


def bsp_us(row: Mapping[str, Any]) -> float | None:
    """The fastest BSP form of a row at its faster mode: ``bsp`` and every other form the row measured
    (``bsp_forms``, e.g. ``bsp_symm``): what every speedup of the row is against."""
    variants = row.get("variants") or {}
    times = [best_us(row.get("bsp"))]
    times += [best_us(variants.get(n)) for n in row.get("bsp_forms", ()) if n != "bsp"]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def row_op(row: Mapping[str, Any]) -> str:
    """The op of a result row (rows of the first files name none: the default op)."""
    from .ops import DEFAULT_OP

    return row.get("op") or DEFAULT_OP


def case_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A result row's shape and layout fields, in the op's order (a row of a file written before rows
    named each op's own layout field: its :data:`LEGACY_DIM` read as the op's first keyword layout)."""
    op = _op(row_op(row))
    out = {f: row[f] for f in (*op.shape_fields, *op.layout_choices) if f in row}
    dims = [f for f in op.call_layout() if f not in out]
    if dims and LEGACY_DIM in row:
        out[dims[0]] = row[LEGACY_DIM]
    return out


def problem_text(row: Mapping[str, Any], compact: bool = False, op: bool = True) -> str:
    """A row's problem in one short cell, dtype aside: ``ag_gemm M=64 N=256 K=256 gd=0 nk``; ``compact``:
    ``64x256x256 gd=0 nk``; ``op=False``: without the op's name."""
    from ._problem import IMPLICIT_LAYOUT, SHORT_LAYOUT

    fields = case_fields(row)
    shape = [f for f in _op(row_op(row)).shape_fields if f in fields]
    words = ["x".join(str(fields[f]) for f in shape)] if compact else [f"{f}={fields[f]}" for f in shape]
    for f, v in fields.items():
        if f in shape or IMPLICIT_LAYOUT.get(f) == v:
            continue
        words.append(v if isinstance(v, str) else f"{SHORT_LAYOUT.get(f, f)}={v}")
    return " ".join([row_op(row), *words] if op else words)


def part_names(row: Mapping[str, Any]) -> list[str]:
    """The entries of a row that time the pieces of BSP alone, communication first (``parts``; rows of
    older files: their ``allgather``/``reduce_scatter`` and ``gemm`` entries)."""
    if "parts" in row:
        return list(row["parts"])
    return [n for n in ("allgather", "reduce_scatter", "gemm") if n in row]


def row_entries(row: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Everything compared against BSP in a row: variants, then dispatch and the peers."""
    out: dict[str, Mapping[str, Any]] = dict(row.get("variants") or {})
    skip = {"bsp", "variants", *part_names(row)}
    if "dispatch" in row:
        out["dispatch"] = row["dispatch"]
    for name, entry in row.items():
        if isinstance(entry, Mapping) and name not in skip and name not in out:
            out[name] = entry
    return out


def comm_entry(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's communication alone (its first part: the all-gather, the reduce-scatter, ...)."""
    names = part_names(row)
    return row.get(names[0]) if names else None


def compute_entry(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's local compute alone (its last part, e.g. the GEMM)."""
    names = part_names(row)
    return row.get(names[-1]) if len(names) > 1 else None


def ceiling_us(row: Mapping[str, Any]) -> float | None:
    """The best possible fused time: the slowest part alone (e.g. max(communication, GEMM)), each at its
    faster mode."""
    times = [best_us(row.get(n)) for n in part_names(row)]
    return max(times) if times and None not in times else None


def _fmt(us: float | None) -> str:
    return "-" if us is None or not math.isfinite(us) else f"{us / 1e3:.3f}"


def row_line(row: Mapping[str, Any]) -> str:
    """One printable line: the problem, BSP eager/graph, communication and compute alone, each entry with
    its speedup."""
    head = problem_text(row)
    if "error" in row:
        return f"{head} | {row['error']}"
    bsp = bsp_us(row)
    parts = [
        head,
        f"{_fmt(row['bsp'].get('eager'))}/{_fmt(row['bsp'].get('graph'))}",
        _fmt(best_us(comm_entry(row))),
        _fmt(best_us(compute_entry(row))),
    ]
    ceiling = ceiling_us(row)
    parts.append(f"ceiling {SPEEDUP}{bsp / ceiling:.2f}" if bsp and ceiling else "ceiling -")
    for name, entry in row_entries(row).items():
        t = best_us(entry)
        if "skipped" in entry:
            continue
        if t is None:
            parts.append(f"{name}: {untimed_label(entry)}")
        else:
            times = f"{_fmt(entry.get('eager'))}/{_fmt(entry.get('graph'))}"
            parts.append(f"{name}: {times} {SPEEDUP}{bsp / t:.2f}" if bsp else f"{name}: {times}")
    return " | ".join(parts)


def fastest_entry(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """``(name, µs)`` of the row's fastest timed form: BSP, a variant or a peer (dispatch aside, which
    serves one of them), or None. BSP counts, so the fastest is never slower than BSP."""
    entries = [("bsp", row.get("bsp")), *row_entries(row).items()]
    timed = [(t, n) for n, e in entries if n != "dispatch" and (t := best_us(e)) is not None]
    return (min(timed)[1], min(timed)[0]) if timed else None


def served_text(row: Mapping[str, Any]) -> str:
    """What dispatch served in ``row`` (``bsp``, ``cpu_chunked``, ...), "" where unknown."""
    entry = row.get("dispatch")
    return str(entry.get("variant", "")) if isinstance(entry, Mapping) else ""


def progress_line(row: Mapping[str, Any]) -> str:
    """A finished row in a short line: ``BSP 0.472 ms | fastest push ×1.20 | dispatch (push) ×1.18 |
    ceiling ×1.35`` (the row's error instead, when it has one). Every time in it comes from the same
    interleaved run."""
    if "error" in row:
        return f"error: {row['error']}"
    bsp = bsp_us(row)
    parts = [f"BSP {_fmt(bsp)} ms"]
    fastest = fastest_entry(row)
    if fastest is not None and bsp:
        parts.append(f"fastest {fastest[0]} {SPEEDUP}{bsp / fastest[1]:.2f}")
    dispatch = best_us(row.get("dispatch"))
    if dispatch is not None and bsp:
        parts.append(f"dispatch ({served_text(row)}) {SPEEDUP}{bsp / dispatch:.2f}")
    ceiling = ceiling_us(row)
    if ceiling is not None and bsp:
        parts.append(f"ceiling {SPEEDUP}{bsp / ceiling:.2f}")
    return " | ".join(parts)


def untimed_label(entry: Mapping[str, Any]) -> str:
    """What a variant's cell says when it has no time: ``n/a`` where no configuration of it is valid at the
    shape (a copy-engine variant at one rank, say), ``FAIL`` where every one it tried failed."""
    return "n/a" if entry.get("valid_configs") == 0 else "FAIL"


TABLE_LEGEND = (
    "ms per call; BSP eager/graph; communication and compute alone at their faster mode; ceiling = BSP /\n"
    "the slower of them; entries eager/graph and ×speedup = the fastest BSP form (bsp and e.g. bsp_symm,\n"
    "each at its faster mode) / entry's faster mode; a row's entries are timed interleaved in one run\n"
    "problem | BSP e/g | comm | compute | ceiling | ..."
)
