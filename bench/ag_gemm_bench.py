"""Side-by-side ag_gemm benchmark on 2 GPUs (or --world-size): a command line over :mod:`autotaxer.benchmark`.

For each shape (N, K), layout and M: BSP, all-gather alone, GEMM alone, each variant's best configuration
(tuned in ``--db``, else a capped sweep), ``dispatch()``, PyTorch's ``fused_all_gather_matmul``
(gather_dim=0) and Iris' stock ``all_gather_matmul`` (gather_dim=1). Writes JSON and prints a table;
speedups are against the faster BSP (min of eager and graph) using the entry's faster mode.
``autotaxer bench --shapes shapes.csv`` runs the same benchmark from a shapes file.

    python bench/ag_gemm_bench.py --quick --out bench/results/ag_gemm_quick.json
"""

from __future__ import annotations

import argparse

from autotaxer.benchmark.case import BenchConfig, Case
from autotaxer.benchmark.rows import TABLE_LEGEND, row_line
from autotaxer.benchmark.run import run_bench

SHAPES = ((8192, 8192), (28672, 8192), (8192, 28672))  # (N, K)
MS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_MS = (16, 256, 1024, 4096)


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"M in {QUICK_MS}, N=K=8192, fewer samples")
    p.add_argument("--shapes", default=None, help="comma list of NxK, e.g. 8192x8192,28672x8192")
    p.add_argument("--m", default=None, help="comma list of M values")
    p.add_argument("--layouts", default="0,1", help="gather_dim values, comma list")
    p.add_argument("--variants", default=None, help="comma list of variant names (default: all available)")
    p.add_argument("--world-size", type=int, default=2, help="GPUs (ranks) per problem")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--max-configs", type=int, default=None, help="configs per variant (8; 6 with --quick)")
    p.add_argument("--no-peers", action="store_true", help="skip torch symm_mem and Iris stock")
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
    if a.world_size < 1:
        p.error(f"--world-size: must be >= 1, got {a.world_size}")
    if a.max_configs is not None and a.max_configs < 1:
        p.error(f"--max-configs: must be >= 1, got {a.max_configs}")
    layouts = ints(a.layouts, "layouts")
    if not set(layouts) <= {0, 1}:
        p.error(f"--layouts: gather_dim must be 0 or 1, got {a.layouts!r}")
    ms = ints(a.m, "m") if a.m else (QUICK_MS if a.quick else MS)
    cfg = BenchConfig(
        cases=tuple(
            Case.of("ag_gemm", a.dtype, M=m, N=n, K=k, gather_dim=gd)
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


def main(argv: list[str] | None = None) -> int:
    cfg, out_path = parse_args(argv)
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
