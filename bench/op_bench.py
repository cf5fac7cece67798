"""The per-op bench: ``autotaxer bench`` over ``NxK`` and ``M`` lists of one op, on 2 GPUs (or --world-size).

For each shape (N, K), layout (``gather_dim`` of ag_gemm, ``scatter_dim`` of gemm_rs) and M: BSP, the
communication alone, the GEMM alone, each variant's best configuration (tuned in ``--db``, else a capped
sweep), ``dispatch()`` and the op's peers (ag_gemm: PyTorch's ``fused_all_gather_matmul`` and Iris' stock
``all_gather_matmul``; gemm_rs: PyTorch's ``fused_matmul_reduce_scatter``). Writes JSON and prints a
table; speedups are against the faster BSP (min of eager and graph) using the entry's faster mode.
``autotaxer bench --shapes shapes.csv`` runs the same benchmark from a shapes file.

``--summarize FILE...`` instead prints a markdown table of finished results (this script's or ``autotaxer
bench``'s JSON): per shape, layout and M, BSP (eager / graph), the ceiling max(communication, GEMM) as a
speedup over the faster BSP, the best fused variant, dispatch and the peers as speedups over the faster
BSP (each at its own faster mode), the same for eager against eager, whether the best fused variant is
within 10% of the ceiling, and the geometric means.

    python3 -P bench/op_bench.py --quick --out ag_gemm_quick.json
    python3 -P bench/op_bench.py --op gemm_rs --shapes 8192x8192 --m 1024,4096 --out gemm_rs.json
    python bench/op_bench.py --summarize bench_8192x8192.json bench_mlp.json > summary.md
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from autotaxer.benchmark.case import BenchConfig, Case
from autotaxer.benchmark.rows import TABLE_LEGEND, best_us, bsp_us, case_fields, ceiling_us, row_line
from autotaxer.benchmark.run import run_bench

SHAPES = ((8192, 8192), (28672, 8192), (8192, 28672))  # (N, K)
MS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_MS = (16, 256, 1024, 4096)
#: Each op's layout field (its values: ``--layouts``).
LAYOUT_FIELD = {"ag_gemm": "gather_dim", "gemm_rs": "scatter_dim"}
PEERS = ("torch_fused", "iris_stock")


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig | None, str | list[str]]:
    """``(config, output file)`` of a run, or ``(None, results files)`` with ``--summarize``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="ag_gemm", choices=tuple(LAYOUT_FIELD), help="the op (default ag_gemm)")
    p.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, N=K=8192, fewer samples")
    p.add_argument("--shapes", default=None, help="comma list of NxK, e.g. 8192x8192,28672x8192")
    p.add_argument("--m", default=None, help="comma list of M values")
    p.add_argument("--layouts", default="0,1", help="gather_dim (scatter_dim) values, comma list")
    p.add_argument("--variants", default=None, help="comma list of variant names (default: all available)")
    p.add_argument("--world-size", type=int, default=2, help="GPUs (ranks) per problem")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--max-configs", type=int, default=None, help="configs per variant (8; 6 with --quick)")
    p.add_argument("--no-peers", action="store_true", help="skip the peers (torch symm_mem, Iris stock)")
    p.add_argument("--no-dispatch", action="store_true", help="skip autotaxer.dispatch")
    p.add_argument("--db", default=None, help="tuning database URL: tuned configs and dispatch's table")
    p.add_argument(
        "--dispatch-timing", default=None, choices=("eager", "graph"),
        help="dispatch serves only winners tuned with this --timing (BSP elsewhere)",
    )  # fmt: skip
    p.add_argument("--peer-timeout", type=float, default=180.0, help="seconds for Iris stock, per shape")
    p.add_argument("--heap-gib", type=int, default=8, help="Iris heap per rank (GiB)")
    p.add_argument("--iters", type=int, default=None, help="calls per timed sample (20; 10 with --quick)")
    p.add_argument("--samples", type=int, default=None, help="timed samples, median of them (9; 5 --quick)")
    p.add_argument("--out", default="op_bench.json", help="JSON file (default op_bench.json)")
    p.add_argument("--summarize", nargs="+", metavar="FILE", help="print the markdown table of results files")
    a = p.parse_args(argv)
    if a.summarize:
        return None, a.summarize

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
    if a.world_size < 1:
        p.error(f"--world-size: must be >= 1, got {a.world_size}")
    if a.max_configs is not None and a.max_configs < 1:
        p.error(f"--max-configs: must be >= 1, got {a.max_configs}")
    layouts = ints(a.layouts, "layouts")
    if not set(layouts) <= {0, 1}:
        p.error(f"--layouts: {LAYOUT_FIELD[a.op]} must be 0 or 1, got {a.layouts!r}")
    ms = ints(a.m, "m") if a.m else (QUICK_MS if a.quick else MS)
    cfg = BenchConfig(
        cases=tuple(
            Case.of(a.op, a.dtype, M=m, N=n, K=k, **{LAYOUT_FIELD[a.op]: gd})
            for n, k in shapes
            for gd in layouts
            for m in ms
        ),
        world_size=a.world_size,
        device="cuda",
        variants=tuple(a.variants.split(",")) if a.variants else None,
        max_configs=a.max_configs if a.max_configs is not None else (6 if a.quick else 8),
        warmup=5,
        iters=a.iters if a.iters is not None else (10 if a.quick else 20),
        samples=a.samples if a.samples is not None else (5 if a.quick else 9),
        peers=not a.no_peers,
        dispatch=not a.no_dispatch,
        db_url=a.db,
        dispatch_timing=a.dispatch_timing,
        heap_gib=a.heap_gib,
        peer_timeout=a.peer_timeout,
        progress_path=a.out + ".rows.jsonl",
    )
    return cfg, a.out


def _dim(row: dict) -> int:
    """The row's gather or scatter dimension (its op's first integer layout field)."""
    return next(v for f, v in case_fields(row).items() if f not in ("M", "N", "K") and isinstance(v, int))


def _x(base: float | None, t: float | None) -> str:
    return "-" if base is None or t is None else f"{base / t:.2f}"


def _best_variant(row: dict[str, Any], mode: str | None = None) -> tuple[str | None, float | None]:
    best: tuple[str | None, float | None] = (None, None)
    for name, entry in (row.get("variants") or {}).items():
        t = best_us(entry) if mode is None else entry.get(mode)
        if isinstance(t, (int, float)) and math.isfinite(t) and t > 0 and (best[1] is None or t < best[1]):
            best = (name, t)
    return best


def summarize(rows: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """Markdown lines and totals (geometric means, ceiling hits) for ``rows``."""
    lines = [
        "| N | K | gd | M | BSP eager / graph µs | ceiling x | best fused (x) | within 10% of ceiling "
        "| dispatch x (runs) | torch x | iris x | eager: fused x / dispatch x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    logs: dict[str, list[float]] = {"fused": [], "dispatch": [], "fused_eager": [], "dispatch_eager": []}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['N']} | {r['K']} | {_dim(r)} | {r['M']} | error: {r['error'][:60]} |")
            continue
        be, bg = r["bsp"].get("eager"), r["bsp"].get("graph")
        base = bsp_us(r)
        ceil = ceiling_us(r)
        name, t = _best_variant(r)
        ename, te = _best_variant(r, "eager")
        disp = r.get("dispatch") or {}
        td = best_us(disp)
        within = "-" if t is None or ceil is None else ("yes" if t <= 1.1 * ceil else "no")
        peers = [_x(base, best_us(r.get(p))) if r.get(p) and best_us(r.get(p)) else "-" for p in PEERS]
        lines.append(
            f"| {r['N']} | {r['K']} | {_dim(r)} | {r['M']} | {be:.1f} / {bg:.1f} | {_x(base, ceil)} "
            f"| {name} ({_x(base, t)}) | {within} | {_x(base, td)} ({disp.get('variant', '-')}) "
            f"| {peers[0]} | {peers[1]} | {ename} {_x(be, te)} / {_x(be, disp.get('eager'))} |"
        )
        for key, value, ref in (
            ("fused", t, base),
            ("dispatch", td, base),
            ("fused_eager", te, be),
            ("dispatch_eager", disp.get("eager"), be),
        ):
            if value and ref:
                logs[key].append(math.log(ref / value))
    totals = {k: round(math.exp(sum(v) / len(v)), 3) if v else None for k, v in logs.items()}
    return lines, totals


def summarize_files(paths: list[str]) -> str:
    """The markdown table of these results files, rows sorted by shape, layout and M, and the means."""
    rows = []
    for path in paths:
        with open(path) as f:
            rows += json.load(f)["rows"]
    rows.sort(key=lambda r: (r["N"], r["K"], _dim(r), r["M"]))
    lines, totals = summarize(rows)
    return "\n".join(lines) + f"\n\ngeometric means over {len(rows)} rows (x over BSP): {json.dumps(totals)}"


def main(argv: list[str] | None = None) -> int:
    cfg, out_path = parse_args(argv)
    if cfg is None:
        print(summarize_files(out_path))
        return 0
    tuned = {}
    if cfg.db_url is not None:
        from autotaxer._target import cuda_target
        from autotaxer.benchmark.tuned import tuned_params
        from autotaxer.storage import open_database

        with open_database(cfg.db_url) as db:
            tuned = tuned_params(db, cfg.cases, cuda_target(0).gpu_model, cfg.world_size)
    report = run_bench(cfg, tuned, out_path)
    print(f"\n{report['device']} x{cfg.world_size}")
    print(TABLE_LEGEND)
    for row in report["rows"]:
        print(row_line(row))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
