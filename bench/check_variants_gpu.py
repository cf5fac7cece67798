"""Run the GPU correctness check of ``tests/ops/test_ag_gemm_gpu.py`` for chosen variants at one world size.

    python bench/check_variants_gpu.py --world-size 4 --variants ce_fanout,push_tma

Every case of that test (both layouts, M from 8 to 4096, N=K=1000), each variant's default and one more
configuration, eager calls and CUDA-graph replays against the fp32 reference; prints the failures (none:
"OK") and exits non-zero on any. For a variant the full 4-GPU test would take too long to reach.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ops"))


def _rank(ctx, only: tuple[str, ...], calls: int) -> tuple[list[str], list[str]]:
    """``(the variants of only available here, the failures)`` on one rank."""
    from test_ag_gemm_gpu import _check_all

    from autotaxer.ops import get_op

    available = sorted(set(only) & set(get_op("ag_gemm").available_variants(ctx.target)))
    return available, _check_all(ctx, "bf16", calls, only, (), False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--variants", required=True, help="comma list")
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--timeout", type=float, default=400.0)
    args = p.parse_args()
    from autotaxer.testing import run_ranks

    only = tuple(args.variants.split(","))
    results = run_ranks(_rank, args.world_size, "cuda", args=(only, args.calls), timeout=args.timeout)
    available = results[0][0]
    failures = [f for _, per_rank in results for f in per_rank]
    missing = sorted(set(only) - set(available))
    print("\n".join(failures[:40]) if failures else f"OK: {', '.join(available)} at {args.world_size} GPUs")
    if missing:
        print(f"not available here: {', '.join(missing)}")
    sys.exit(1 if failures or missing else 0)


if __name__ == "__main__":
    main()
