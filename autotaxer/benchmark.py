"""Side-by-side ``ag_gemm`` benchmark: BSP, its parts, every variant, dispatch and the peers, in one run.

For each case (M, N, K, layout, dtype) on ``world_size`` spawned ranks: BSP (all-gather + vendor GEMM),
the all-gather alone, the GEMM alone (the ceiling of any fused kernel is the larger of the two), every
available variant at its tuned configuration (the best COMPLETE trial of that variant in the case's Optuna
study; a capped sweep of its search space where the database has none), ``dispatch()`` as a user would
call it, PyTorch's ``fused_all_gather_matmul`` (gather_dim=0) and Iris' stock ``all_gather_matmul``
(gather_dim=1, in its own process group with a time limit so a hang is reported, not fatal). Every
configuration is validated against the fp32 reference before it is timed. A row's entries are timed
side by side with :func:`autotaxer.measure.time_interleaved` once all are ready: ``eager`` (back-to-back
calls) and, on CUDA, ``graph`` (calls captured in one CUDA graph), one sample of each entry in turn, so a
slow stretch of the machine falls on all of them alike; median of the samples, max across ranks,
microseconds. Iris' stock kernel runs in its own process group afterwards, so it is timed on its own. (A
variant without a tuned configuration first picks the best of its capped sweep by eager time, one
configuration after another.)

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

#: Entries that every row has, in table order (``variants`` holds one entry per variant).
BASE_COLUMNS = ("bsp", "allgather", "gemm")
#: Peer implementations: PyTorch's (gather_dim=0) and Iris' stock kernel (gather_dim=1).
PEERS = {"torch_fused": 0, "iris_stock": 1}
UNITS = "microseconds per call, median, max over ranks; eager = back-to-back, graph = CUDA graph"
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: global ``M, N, K``, the layout, the dtype and the op (``ag_gemm`` or
    ``gemm_rs``; ``gather_dim`` is the op's dimension: the scatter dim of ``gemm_rs``)."""

    M: int
    N: int
    K: int
    gather_dim: int = 0
    dtype: str = "bf16"
    b_layout: str = "kn"
    op: str = "ag_gemm"

    def key(self, gpu_model: str, world_size: int) -> ProblemKey:
        """The problem key of this case on ``gpu_model`` with ``world_size`` ranks."""
        return ProblemKey.make(
            self.op,
            gpu_model,
            world_size,
            self.dtype,
            {"M": self.M, "N": self.N, "K": self.K},
            {DIM_FIELD[self.op]: self.gather_dim, "b_layout": self.b_layout},
        )


@dataclass(frozen=True)
class BenchConfig:
    """What to run; frozen so every rank gets the same plan.

    ``variants``: None = every available non-baseline variant of the tuner's default space. ``max_configs``:
    configurations swept per variant that has no tuned configuration. ``db_url``/``tables``: where tuned
    configurations and dispatch's table come from (None/empty: dispatch's defaults); ``dispatch_timing``
    is dispatch's ``RuntimeConfig.timing`` (only winners tuned that way). ``progress_path``:
    rank 0 appends each finished row there as one JSON line, so a run cut short keeps what it measured.
    """

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

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        if not self.cases:
            raise ValueError("cases: nothing to benchmark")
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
            if c.dtype not in DTYPES:
                raise ValueError(f"dtype: unknown dtype {c.dtype!r} (expected one of {', '.join(DTYPES)})")
            if c.gather_dim not in (0, 1):
                raise ValueError(f"gather_dim: must be 0 or 1, got {c.gather_dim}")
            if c.b_layout not in ("kn", "nk"):
                raise ValueError(f"b_layout: must be kn or nk, got {c.b_layout!r}")

    @property
    def modes(self) -> tuple[str, ...]:
        """Timing modes: eager and CUDA graph on GPUs, eager only on CPU."""
        return ("eager", "graph") if self.device == "cuda" else ("eager",)


#: Tuned configurations: case index -> variant name -> params.
Tuned = Mapping[int, Mapping[str, Mapping[str, Any]]]


#: The ops ``bench`` runs and the layout field each calls its dimension.
DIM_FIELD = {"ag_gemm": "gather_dim", "gemm_rs": "scatter_dim"}


def cases_from_shapes(rows: Iterable[Any]) -> tuple[Case, ...]:
    """Cases of the ``ag_gemm`` and ``gemm_rs`` rows of a shapes file (:class:`autotaxer.shapes.ShapeRow`)."""
    return tuple(
        Case(
            r.shape["M"],
            r.shape["N"],
            r.shape["K"],
            r.layout.get(DIM_FIELD[r.op], 0),
            r.dtype,
            r.layout.get("b_layout", "kn"),
            r.op,
        )  # fmt: skip
        for r in rows
        if r.op in DIM_FIELD
    )


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

    ``add`` registers an entry (its result dict) with the callable to time; ``run`` times them all with
    :func:`autotaxer.measure.time_interleaved` (one sample of each in turn, every mode of ``cfg``) and
    writes each one's times into its dict. Collective.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[dict[str, Any], Callable[[], Any]]] = []

    def add(self, entry: dict[str, Any], fn: Callable[[], Any]) -> dict[str, Any]:
        """Time ``fn`` into ``entry`` at the next :meth:`run`; returns ``entry``."""
        self._pending.append((entry, fn))
        return entry

    def run(self, ctx: Any, cfg: BenchConfig) -> None:
        """Time every registered entry (collective); afterwards none is pending."""
        from .measure import time_interleaved

        if not self._pending:
            return
        fns = [fn for _, fn in self._pending]
        times = time_interleaved(fns, ctx, cfg.modes, warmup=cfg.warmup, iters=cfg.iters, samples=cfg.samples)
        for (entry, _), t in zip(self._pending, times, strict=True):
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
            t = time_variant(fn, ctx, warmup=cfg.warmup, iters=cfg.iters, mode="eager", samples=cfg.samples)
            tried.append({"params": params, "eager": t, "err": err})
            if best is None or t < best[0]:
                best = (t, params, ws, out, err)
        except Exception as exc:
            failed.append({"params": params, "error": error_text(exc)})
    result.update(tried=tried, failed=failed)
    if best is not None:
        _, params, ws, out, err = best
        result.update(best_params=params, err=err)
        timings.add(result, partial(variant.run, ws, inputs, ctx, out=out))
    return result


def _dispatch_entry(rt, op, key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict[str, Any]:
    """``dispatch`` as a user calls it (its plan created by an untimed first call), registered with
    ``timings``."""
    from .ops import relative_error

    layout = {DIM_FIELD[key.op]: key[DIM_FIELD[key.op]]}
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
        return timings.add(entry, partial(rt.dispatch, key.op, *inputs, out=out, **layout))
    except Exception as exc:
        return {"error": error_text(exc)}


def _torch_fused(key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict[str, Any]:
    if ctx.target.device_type != "cuda":
        return {"skipped": "needs CUDA"}
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from .ops import get_op, relative_error

    try:
        group_name = dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group") and torch.__version__ < "2.10":  # later: implied
            symm_mem.enable_symm_mem_for_group(group_name)
        a, b = inputs
        if key.op == "ag_gemm":
            fn = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group_name)
            c = fn()[1][0]
        else:
            fn = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)
            c = fn()
        torch.cuda.synchronize()
        err = relative_error(c, get_op(key.op).reference(key, ctx.rank, ctx.device, cfg.seed))
        return timings.add({"err": err}, fn)
    except Exception as exc:
        return {"error": error_text(exc)}


def _torch_rank(ctx: Any, cfg: BenchConfig, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """torch's ``fused_all_gather_matmul`` for ``cases``, timed side by side with ``bsp`` (both reported;
    the row's speedups use the main group's BSP forms)."""
    from .ops import get_op

    out_rows = []
    for case in cases:
        op = get_op(case.op)
        bsp = op.baseline()
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        timings = RowTimings()
        ws = bsp.prepare(key, {}, ctx)
        base = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=op.empty_output(key, ctx.device)))
        entry = _torch_fused(key, ctx, inputs, cfg, timings)
        timings.run(ctx, cfg)
        out_rows.append({**entry, "bsp_same_group": base} if "error" not in entry else entry)
    return out_rows


def torch_fused_peer(cfg: BenchConfig, cases: tuple[Case, ...]) -> dict[Case, dict[str, Any]]:
    """torch's fused kernel per case in a process group of its own (its symmetric memory must run the
    CUDA backend, while ``bsp_symm`` runs NCCL's in the main group)."""
    return _peer_group(_torch_rank, cfg, cases)


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


#: The row entry of each op's communication alone (the other half of the ceiling is the GEMM alone).
COMM_ENTRY = {"ag_gemm": "allgather", "gemm_rs": "reduce_scatter"}


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


def _parts(key: ProblemKey, ctx: Any, inputs: tuple, ws: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``(communication alone, GEMM alone)`` of ``key`` with BSP's buffers ``ws``: ``ag_gemm``: the
    all-gather, and the full ``A @ B``; ``gemm_rs``: the reduce-scatter of the partial product, and the
    local ``A_r @ B_r``."""
    import torch

    from ._problem import torch_dtype

    if key.op == "ag_gemm":
        from .ops.ag_gemm.bsp import all_gather_shards

        a_full = torch.randn((key["M"], key["K"]), device=ctx.device).to(torch_dtype(key.dtype))
        gemm_out = torch.empty((key["M"], key["N"]), dtype=a_full.dtype, device=ctx.device)
        comm = partial(all_gather_shards, inputs[0], ws.buffers["gathered"], ctx)
        return comm, partial(torch.matmul, a_full, inputs[1], out=gemm_out)
    from .ops.gemm_rs._op import out_shape
    from .ops.gemm_rs.bsp import reduce_scatter

    partial_product = ws.buffers["partial"]
    rs_out = torch.empty(out_shape(key), dtype=partial_product.dtype, device=ctx.device)
    comm = partial(reduce_scatter, partial_product, rs_out, key["scatter_dim"], ctx.group)
    return comm, partial(torch.matmul, inputs[0], inputs[1], out=torch.empty_like(partial_product))


def bench_rank(ctx: Any, cfg: BenchConfig, tuned: Tuned) -> list[dict[str, Any]]:
    """Every case of ``cfg`` on this rank (collective); the rows (identical on every rank)."""

    from .ops import get_op

    ctx.heap_size = cfg.heap_gib << 30
    rt, rt_error = _runtime(cfg, ctx) if cfg.dispatch else (None, None)
    rows = []
    for i, case in enumerate(cfg.cases):
        row_start = time.monotonic()
        if ctx.rank == 0:  # progress on stderr: stdout may carry the JSON report
            print(f"[{i + 1}/{len(cfg.cases)}] {case_text(case)} ...", file=sys.stderr, flush=True)
        op = get_op(case.op)
        available = op.available_variants(ctx.target)
        names = _entries(op, available, cfg.variants, ctx.world_size)
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        row: dict[str, Any] = asdict(case)
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
        row["bsp"] = timings.add({}, partial(bsp.run, ws, inputs, ctx, out=out))
        comm, gemm = _parts(key, ctx, inputs, ws)  # the communication alone and the GEMM alone
        row[COMM_ENTRY[case.op]] = timings.add({}, comm)
        row["gemm"] = timings.add({}, gemm)
        row["variants"] = {
            n: _variant_entry(op, available[n], key, ctx, inputs, cfg, tuned.get(i, {}).get(n), timings)
            for n in names
        }
        row["bsp_forms"] = ["bsp", *(n for n in names if available[n].bsp_form)]
        if cfg.dispatch:
            row["dispatch"] = (
                {"error": rt_error} if rt is None else _dispatch_entry(rt, op, key, ctx, inputs, cfg, timings)
            )
        if cfg.peers and case.gather_dim == PEERS["torch_fused"] and "bsp_symm" not in names:
            # (with bsp_symm, torch's symmetric memory runs NCCL's backend in this process: the torch
            # peer then runs in a process group of its own, after this one, see torch_fused_peer)
            row["torch_fused"] = _torch_fused(key, ctx, inputs, cfg, timings)
        timings.run(ctx, cfg)
        if cfg.peers and _iris_case(case) and ctx.target.device_type != "cuda":
            row["iris_stock"] = {"skipped": "needs CUDA"}
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
    """``ag_gemm M=64 N=256 K=256 gather_dim=0 kn fp32``: a case in one short line."""
    dim = DIM_FIELD[case.op]
    return f"{case.op} M={case.M} N={case.N} K={case.K} {dim}={case.gather_dim} {case.b_layout} {case.dtype}"


def _iris_rank(ctx: Any, cfg: BenchConfig, cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    """Iris' stock all_gather_matmul (gather_dim=1) for ``cases``; run in its own process group."""
    import iris.ops
    import torch

    from .ops import get_op, relative_error

    ctx.heap_size = cfg.heap_gib << 30
    shmem = ctx.iris()
    op = get_op("ag_gemm")
    out_rows = []
    for case in cases:
        key = case.key(ctx.target.gpu_model, ctx.world_size)
        a_shard, b = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        a_sym = shmem.empty(a_shard.shape, dtype=a_shard.dtype)
        a_sym.copy_(a_shard)
        out = op.empty_output(key, ctx.device)
        shmem.barrier()
        wsp = iris.ops.all_gather_matmul_preamble(shmem, a_sym, b)
        fn = partial(iris.ops.all_gather_matmul, shmem, out, a_sym, b, workspace=wsp)
        fn()
        torch.cuda.synchronize()
        err = relative_error(out, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        timings = RowTimings()  # alone: the rest of the row ran in another process group
        out_rows.append(timings.add({"M": case.M, "err": err}, fn))
        timings.run(ctx, cfg)
    return out_rows


def _iris_case(case: Case) -> bool:
    """Iris ships an all-gather + GEMM for gather_dim=1 only."""
    return case.op == "ag_gemm" and case.gather_dim == PEERS["iris_stock"]


def iris_stock(cfg: BenchConfig, cases: tuple[Case, ...]) -> dict[Case, dict[str, Any]]:
    """Iris stock results per case (same N, K, dtype)."""
    return _peer_group(_iris_rank, cfg, cases)


def _peer_group(rank_fn: Callable[..., Any], cfg: BenchConfig, cases: tuple[Case, ...]) -> dict[Case, Any]:
    """``rank_fn(ctx, cfg, cases)`` on ``cfg.world_size`` fresh GPU ranks: its per-case entries. A group
    that hangs marks every case as timed out; one that raises is retried case by case, so one failing M
    does not hide the others."""
    from .testing import RanksFailed, run_ranks

    if not cases:
        return {}
    try:
        rows = run_ranks(rank_fn, cfg.world_size, "cuda", args=(cfg, cases), timeout=cfg.peer_timeout)
        return dict(zip(cases, rows[0], strict=True))
    except RanksFailed as exc:
        if "did not finish" in str(exc):
            return {c: {"error": f"timed out after {cfg.peer_timeout:.0f} s (hang?)"} for c in cases}
    result = {}
    for case in cases:
        try:
            rows = run_ranks(rank_fn, cfg.world_size, "cuda", args=(cfg, (case,)), timeout=cfg.peer_timeout)
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
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str, allow_nan=True)
    os.replace(tmp, path)


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
    from .testing import run_ranks

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
        "config": asdict(cfg),
        "units": UNITS,
        "rows": rows,
    }
    if out_path is not None:
        write_json(report, out_path)
    if cfg.peers and cfg.device == "cuda":
        separate = [c for c, r in zip(cfg.cases, rows, strict=True) if "bsp_symm" in r.get("bsp_forms", ())]
        separate = [c for c in separate if c.gather_dim == PEERS["torch_fused"]]
        for case, entry in torch_fused_peer(cfg, tuple(separate)).items():
            for row in rows:
                if all(row[f] == v for f, v in asdict(case).items()):
                    row["torch_fused"] = entry
        groups: dict[tuple[int, int, str], list[Case]] = {}
        for c in cfg.cases:
            if _iris_case(c) and c.K % cfg.world_size == 0:
                groups.setdefault((c.N, c.K, c.dtype), []).append(c)
        for group in groups.values():
            for case, entry in iris_stock(cfg, tuple(group)).items():
                for row in rows:
                    if all(row[f] == v for f, v in asdict(case).items()):
                        row["iris_stock"] = entry
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


def row_entries(row: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Everything compared against BSP in a row: variants, then dispatch and the peers."""
    out: dict[str, Mapping[str, Any]] = dict(row.get("variants") or {})
    for name in ("dispatch", *PEERS):
        if name in row:
            out[name] = row[name]
    return out


def comm_entry(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's communication alone: the all-gather (``ag_gemm``) or the reduce-scatter (``gemm_rs``)."""
    return row.get(COMM_ENTRY.get(row.get("op", "ag_gemm"), "allgather"))


def ceiling_us(row: Mapping[str, Any]) -> float | None:
    """The best possible fused time: max(communication alone, GEMM alone), each at its faster mode."""
    comm, gemm = best_us(comm_entry(row)), best_us(row.get("gemm"))
    return max(comm, gemm) if comm is not None and gemm is not None else None


def _fmt(us: float | None) -> str:
    return "-" if us is None or not math.isfinite(us) else f"{us / 1e3:.3f}"


def row_line(row: Mapping[str, Any]) -> str:
    """One printable line: shape, BSP eager/graph, AG and GEMM alone, each entry with its speedup."""
    op = "" if row.get("op", "ag_gemm") == "ag_gemm" else "rs "
    head = f"{op}{row['N']:>5} {row['K']:>5} {row['gather_dim']:>2} {row.get('b_layout', 'kn')} {row['M']:>5}"
    if "error" in row:
        return f"{head} | {row['error']}"
    bsp = bsp_us(row)
    parts = [
        head,
        f"{_fmt(row['bsp'].get('eager'))}/{_fmt(row['bsp'].get('graph'))}",
        _fmt(best_us(comm_entry(row))),
        _fmt(best_us(row["gemm"])),
    ]
    ceiling = ceiling_us(row)
    parts.append(f"ceiling x{bsp / ceiling:.2f}" if bsp and ceiling else "ceiling -")
    for name, entry in row_entries(row).items():
        t = best_us(entry)
        if "skipped" in entry:
            continue
        if t is None:
            parts.append(f"{name}: {untimed_label(entry)}")
        else:
            times = f"{_fmt(entry.get('eager'))}/{_fmt(entry.get('graph'))}"
            parts.append(f"{name}: {times} x{bsp / t:.2f}" if bsp else f"{name}: {times}")
    return " | ".join(parts)


def fastest_entry(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """``(name, µs)`` of the row's fastest timed variant or peer (dispatch aside), or None."""
    entries = row_entries(row).items()
    timed = [(t, n) for n, e in entries if n != "dispatch" and (t := best_us(e)) is not None]
    return (min(timed)[1], min(timed)[0]) if timed else None


def progress_line(row: Mapping[str, Any]) -> str:
    """A finished row in a short line: ``BSP 0.472 ms | fastest push x1.20 | dispatch x1.18 | ceiling
    x1.35`` (the row's error instead, when it has one)."""
    if "error" in row:
        return f"error: {row['error']}"
    bsp = bsp_us(row)
    parts = [f"BSP {_fmt(bsp)} ms"]
    fastest = fastest_entry(row)
    if fastest is not None and bsp:
        parts.append(f"fastest {fastest[0]} x{bsp / fastest[1]:.2f}")
    dispatch = best_us(row.get("dispatch"))
    if dispatch is not None and bsp:
        parts.append(f"dispatch x{bsp / dispatch:.2f}")
    ceiling = ceiling_us(row)
    if ceiling is not None and bsp:
        parts.append(f"ceiling x{bsp / ceiling:.2f}")
    return " | ".join(parts)


def untimed_label(entry: Mapping[str, Any]) -> str:
    """What a variant's cell says when it has no time: ``n/a`` where no configuration of it is valid at the
    shape (a copy-engine variant at one rank, say), ``FAIL`` where every one it tried failed."""
    return "n/a" if entry.get("valid_configs") == 0 else "FAIL"


TABLE_LEGEND = (
    "ms per call; BSP eager/graph; AG and GEMM alone at their faster mode; ceiling = BSP / max(AG, GEMM);\n"
    "entries eager/graph and xSpeedup = the fastest BSP form (bsp and e.g. bsp_symm, each at its faster\n"
    "mode) / entry's faster mode\n"
    "    N     K gd     M | BSP e/g | AG | GEMM | ceiling | ..."
)
