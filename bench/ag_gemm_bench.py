"""Side-by-side ag_gemm benchmark (issue 7 item 5): BSP, its parts, every variant's best, and peers.

For each shape (N, K), layout and M, on 2 GPUs: BSP (NCCL all-gather + cuBLAS), all-gather alone,
GEMM alone (cuBLAS on the gathered A), each registered variant's best configuration from a capped sweep
(configs pruned by ``check``, each validated against the fp32 reference before it is timed), PyTorch's
``fused_all_gather_matmul`` (gather_dim=0) and Iris' stock ``all_gather_matmul`` (gather_dim=1, run in
its own process group with a time limit so a hang is reported, not fatal). Every entry is timed eager
(back-to-back) and CUDA-graph captured, median of many after warm-up, max across ranks
(``autotaxer.measure.time_variant``). Writes JSON and prints a table; speedups are against the faster
BSP (min of eager and graph) using the entry's faster mode.

    python bench/ag_gemm_bench.py --quick --out bench/results/ag_gemm_quick.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from autotaxer.testing import RanksFailed, run_ranks

SHAPES = ((8192, 8192), (28672, 8192), (8192, 28672))  # (N, K)
MS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_MS = (16, 256, 1024, 4096)
WORLD_SIZE = 2


@dataclass(frozen=True)
class BenchConfig:
    """What to run; frozen so every rank gets the same plan."""

    shapes: tuple[tuple[int, int], ...]
    ms: tuple[int, ...]
    layouts: tuple[int, ...]
    variants: tuple[str, ...] | None  # None = every available non-baseline variant
    dtype: str
    max_configs: int
    warmup: int
    iters: int
    samples: int
    peers: bool
    heap_gib: int
    peer_timeout: float = 180.0
    seed: int = 1234


# -- per-rank work ------------------------------------------------------------------------------------


def _time(fn, ctx, cfg: BenchConfig) -> dict[str, Any]:
    from autotaxer.measure import time_variant

    out: dict[str, Any] = {}
    for mode in ("eager", "graph"):
        try:
            out[mode] = time_variant(
                fn, ctx, warmup=cfg.warmup, iters=cfg.iters, mode=mode, samples=cfg.samples
            )
        except Exception as exc:  # reported per entry; identical on every rank for deterministic failures
            out[mode] = None
            out[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _capped(configs: list[dict], cap: int) -> list[dict]:
    """At most ``cap`` configs, spread evenly over the valid list (first and last kept)."""
    if len(configs) <= cap:
        return configs
    step = (len(configs) - 1) / (cap - 1) if cap > 1 else 0
    return [configs[round(i * step)] for i in range(cap)]


def _sweep_variant(op, variant, key, ctx, inputs, cfg: BenchConfig) -> dict[str, Any]:
    from autotaxer.measure import check_variant, time_variant
    from autotaxer.ops import iter_grid

    space = variant.search_space(key, ctx.target)
    valid = [p for p in iter_grid(space) if variant.check(key, ctx.target, p) is None]
    tried, failed = [], []
    best: tuple[float, dict, Any] | None = None
    for params in _capped(valid, cfg.max_configs):
        try:
            ws = variant.prepare(key, params, ctx)
            err = check_variant(op, variant, key, params, ctx, cfg.seed, ws=ws)
            if not err <= op.tolerance(key):
                failed.append({"params": params, "error": f"relative error {err:.3g}"})
                continue
            out = op.empty_output(key, ctx.device)
            t = time_variant(
                partial(variant.run, ws, inputs, ctx, out=out),
                ctx,
                warmup=cfg.warmup,
                iters=cfg.iters,
                mode="eager",
                samples=cfg.samples,
            )
            tried.append({"params": params, "eager": t, "err": err})
            if best is None or t < best[0]:
                best = (t, params, (ws, out, err))
        except Exception as exc:
            failed.append({"params": params, "error": f"{type(exc).__name__}: {exc}"[:300]})
    result: dict[str, Any] = {"valid_configs": len(valid), "tried": tried, "failed": failed}
    if best is not None:
        _, params, (ws, out, err) = best
        result["best_params"] = params
        result["err"] = err
        result.update(_time(partial(variant.run, ws, inputs, ctx, out=out), ctx, cfg))
    return result


def _torch_fused(key, ctx, inputs, cfg: BenchConfig) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    from autotaxer.ops import get_op, relative_error

    try:
        group_name = dist.group.WORLD.group_name
        symm_mem.enable_symm_mem_for_group(group_name)
        a_shard, b = inputs
        fn = lambda: torch.ops.symm_mem.fused_all_gather_matmul(
            a_shard, [b], gather_dim=0, group_name=group_name
        )
        c = fn()[1][0]
        torch.cuda.synchronize()
        err = relative_error(c, get_op("ag_gemm").reference(key, ctx.rank, ctx.device, cfg.seed))
        return {"err": err, **_time(fn, ctx, cfg)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _bench_rank(ctx, cfg: BenchConfig) -> list[dict[str, Any]]:
    import torch

    from autotaxer._problem import ProblemKey, torch_dtype
    from autotaxer.ops import get_op
    from autotaxer.ops.ag_gemm.bsp import all_gather_shards

    ctx.heap_size = cfg.heap_gib << 30
    op = get_op("ag_gemm")
    available = op.available_variants(ctx.target)
    names = [n for n, v in available.items() if not v.is_baseline]
    if cfg.variants is not None:
        names = [n for n in names if n in cfg.variants]
    rows = []
    for n, k in cfg.shapes:
        for gd in cfg.layouts:
            for m in cfg.ms:
                key = ProblemKey.make(
                    "ag_gemm",
                    ctx.target.gpu_model,
                    ctx.world_size,
                    cfg.dtype,
                    {"M": m, "N": n, "K": k},
                    {"gather_dim": gd},
                )
                row: dict[str, Any] = {"M": m, "N": n, "K": k, "gather_dim": gd, "dtype": cfg.dtype}
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
                row["bsp"] = _time(partial(bsp.run, ws, inputs, ctx, out=out), ctx, cfg)
                gathered = ws.buffers["gathered"]
                row["allgather"] = _time(partial(all_gather_shards, inputs[0], gathered, ctx), ctx, cfg)
                a_full = torch.randn((m, k), device=ctx.device).to(torch_dtype(cfg.dtype))
                row["gemm"] = _time(partial(torch.matmul, a_full, inputs[1], out=out), ctx, cfg)
                row["variants"] = {}
                for name in names:
                    row["variants"][name] = _sweep_variant(op, available[name], key, ctx, inputs, cfg)
                if cfg.peers and gd == 0:
                    row["torch_fused"] = _torch_fused(key, ctx, inputs, cfg)
                rows.append(row)
                if ctx.rank == 0:
                    print(_row_line(row), flush=True)
    return rows


def _iris_rank(ctx, cfg: BenchConfig, n: int, k: int, ms: tuple[int, ...]) -> list[dict[str, Any]]:
    """Iris' stock all_gather_matmul (gather_dim=1) for one shape; run in its own process group."""
    import iris.ops

    from autotaxer._problem import ProblemKey
    from autotaxer.ops import get_op, relative_error

    ctx.heap_size = cfg.heap_gib << 30
    shmem = ctx.iris()
    op = get_op("ag_gemm")
    out_rows = []
    for m in ms:
        key = ProblemKey.make(
            "ag_gemm",
            ctx.target.gpu_model,
            ctx.world_size,
            cfg.dtype,
            {"M": m, "N": n, "K": k},
            {"gather_dim": 1},
        )
        a_shard, b = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
        a_sym = shmem.empty(a_shard.shape, dtype=a_shard.dtype)
        a_sym.copy_(a_shard)
        out = op.empty_output(key, ctx.device)
        shmem.barrier()
        wsp = iris.ops.all_gather_matmul_preamble(shmem, a_sym, b)
        fn = partial(iris.ops.all_gather_matmul, shmem, out, a_sym, b, workspace=wsp)
        fn()
        import torch

        torch.cuda.synchronize()
        err = relative_error(out, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        out_rows.append({"M": m, "err": err, **_time(fn, ctx, cfg)})
    return out_rows


def _iris_stock(cfg: BenchConfig, n: int, k: int) -> dict[int, dict[str, Any]]:
    """Iris stock results per M. A group that hangs marks every M as timed out; one that raises is
    retried M by M, so one failing M does not hide the others."""
    ms = tuple(cfg.ms) if k % WORLD_SIZE == 0 else ()
    if not ms:
        return {}
    try:
        rows = run_ranks(_iris_rank, WORLD_SIZE, "cuda", args=(cfg, n, k, ms), timeout=cfg.peer_timeout)
        return {r["M"]: r for r in rows[0]}
    except RanksFailed as exc:
        if "did not finish" in str(exc):
            return {m: {"error": f"timed out after {cfg.peer_timeout:.0f} s (hang?)"} for m in ms}
    result = {}
    for m in ms:
        try:
            rows = run_ranks(_iris_rank, WORLD_SIZE, "cuda", args=(cfg, n, k, (m,)), timeout=cfg.peer_timeout)
            result[m] = rows[0][0]
        except RanksFailed as exc:
            result[m] = {"error": str(exc)[-400:]}
    return result


# -- report ---------------------------------------------------------------------------------------------


def _best(entry: dict[str, Any] | None) -> float | None:
    if not entry:
        return None
    vals = [entry.get(m) for m in ("eager", "graph") if entry.get(m) is not None]
    return min(vals) if vals else None


def _fmt(us: float | None) -> str:
    return "-" if us is None or math.isinf(us) else f"{us / 1e3:.3f}"


def _row_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"M={row['M']} N={row['N']} K={row['K']} gd={row['gather_dim']}: {row['error']}"
    bsp = _best(row["bsp"])
    parts = [
        f"{row['N']:>5} {row['K']:>5} {row['gather_dim']:>2} {row['M']:>5}",
        f"{_fmt(row['bsp'].get('eager'))}/{_fmt(row['bsp'].get('graph'))}",
        _fmt(row["allgather"].get("graph")),
        _fmt(row["gemm"].get("graph")),
    ]
    peers = dict(row.get("variants", {}))
    for name in ("torch_fused", "iris_stock"):
        if name in row:
            peers[name] = row[name]
    for name, entry in peers.items():
        t = _best(entry)
        if t is None:
            parts.append(f"{name}: FAIL")
        else:
            parts.append(
                f"{name}: {_fmt(entry.get('eager'))}/{_fmt(entry.get('graph'))} x{bsp / t:.2f}"
                if bsp
                else f"{name}: {_fmt(t)}"
            )
    return " | ".join(parts)


def _environment() -> dict[str, Any]:
    import torch

    from autotaxer._target import software_versions

    return {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "versions": software_versions(),
    }


def _write(report: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)  # never a half-written file


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, N=K=8192, fewer samples")
    p.add_argument("--shapes", default=None, help="comma list of NxK, e.g. 8192x8192,28672x8192")
    p.add_argument("--m", default=None, help="comma list of M values")
    p.add_argument("--layouts", default="0,1", help="gather_dim values, comma list")
    p.add_argument("--variants", default=None, help="comma list of variant names (default: all available)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--max-configs", type=int, default=None, help="configs per variant (8; 6 with --quick)")
    p.add_argument("--no-peers", action="store_true", help="skip torch symm_mem and Iris stock")
    p.add_argument("--peer-timeout", type=float, default=180.0, help="seconds for Iris stock, per shape")
    p.add_argument("--heap-gib", type=int, default=8, help="Iris heap per rank (GiB)")
    p.add_argument("--out", default="bench/results/ag_gemm_bench.json")
    a = p.parse_args(argv)

    def ints(text: str, field: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in text.split(",") if x)
        except ValueError:
            p.error(f"--{field}: expected a comma list of integers, got {text!r}")
            raise

    shapes = SHAPES[:1] if a.quick else SHAPES
    if a.shapes:
        try:
            shapes = tuple(tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(","))
        except ValueError:
            p.error(f"--shapes: expected NxK items, got {a.shapes!r}")
        if any(len(s) != 2 for s in shapes):
            p.error(f"--shapes: expected NxK items, got {a.shapes!r}")
    if a.max_configs is not None and a.max_configs < 1:
        p.error(f"--max-configs: must be >= 1, got {a.max_configs}")
    layouts = ints(a.layouts, "layouts")
    if not set(layouts) <= {0, 1}:
        p.error(f"--layouts: gather_dim must be 0 or 1, got {a.layouts!r}")
    cfg = BenchConfig(
        shapes=shapes,
        ms=ints(a.m, "m") if a.m else (QUICK_MS if a.quick else MS),
        layouts=layouts,
        variants=tuple(a.variants.split(",")) if a.variants else None,
        dtype=a.dtype,
        max_configs=a.max_configs if a.max_configs is not None else (6 if a.quick else 8),
        warmup=5,
        iters=10 if a.quick else 20,
        samples=5 if a.quick else 9,
        peers=not a.no_peers,
        heap_gib=a.heap_gib,
        peer_timeout=a.peer_timeout,
    )
    return cfg, a.out


def main(argv: list[str] | None = None) -> int:
    cfg, out_path = parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    n_cases = len(cfg.shapes) * len(cfg.layouts) * len(cfg.ms)
    rows = run_ranks(_bench_rank, WORLD_SIZE, "cuda", args=(cfg,), timeout=120 + 90 * n_cases)[0]
    report = {
        **_environment(),
        "date": started,
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "config": asdict(cfg),
        "units": "microseconds per call, median, max over ranks; eager = back-to-back, graph = CUDA graph",
        "rows": rows,
    }
    _write(report, out_path)  # before the peers that may hang, so their failure loses nothing
    if cfg.peers and 1 in cfg.layouts:
        for n, k in cfg.shapes:
            stock = _iris_stock(cfg, n, k)
            for row in rows:
                if row["N"] == n and row["K"] == k and row["gather_dim"] == 1 and row["M"] in stock:
                    row["iris_stock"] = stock[row["M"]]
        _write(report, out_path)
    print(f"\n{report['device']} x{WORLD_SIZE}, {cfg.dtype}; ms per call; BSP eager/graph;")
    print("AG and GEMM alone (graph);")
    print("entries eager/graph and xSpeedup = faster BSP / entry's faster mode")
    print("    N     K gd     M | BSP e/g | AG | GEMM | ...")
    for row in rows:
        print(_row_line(row))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
