"""``bsp_symm`` (NCCL symmetric-memory all-gather / reduce-scatter) on GPUs, for ``ag_gemm`` and ``gemm_rs``:
available where NCCL has symmetric windows, right against fp32 in every layout with two results kept, and
measured by the tuner beside ``bsp`` (a BSP form)."""

from __future__ import annotations

import pytest
from _factories import kept_errors, kept_results, layout_keys, on_gpus

from autotaxer.testing import run_ranks

CASES = [
    ("ag_gemm", {"M": 512, "N": 640, "K": 512}, "gather_dim"),
    ("gemm_rs", {"M": 512, "N": 768, "K": 1024}, "scatter_dim"),
]


def _check(ctx) -> dict:
    from autotaxer.ops import get_op
    from autotaxer.ops._symm_backend import select

    select("nccl")  # NCCL's windows need its symmetric-memory backend (torch's fused ops the other)
    found = {}
    for op_name, shape, dim_field in CASES:
        op = get_op(op_name)
        variant = op.variants["bsp_symm"]
        reason = variant.unavailable_reason(ctx.target)
        if reason is not None:
            found[op_name] = reason
            continue
        for dim, layout, key in layout_keys(ctx, op_name, shape, dim_field):
            ws = variant.prepare(key, {}, ctx)
            errs, distinct = kept_errors(op, key, ctx, kept_results(op, variant, ws, key, ctx))
            found[(op_name, dim, layout)] = (max(errs), distinct)
    return found


def _assert(results: list[dict]) -> None:
    import torch

    for per_rank in results:
        for case, got in per_rank.items():
            if isinstance(got, str):  # unavailable: only where NCCL has no symmetric windows
                assert torch.cuda.nccl.version() < (2, 27, 0), (case, got)
                pytest.skip(got)
            err, distinct = got
            assert err < 1e-2, (case, got)
            assert distinct == 2, (case, got)


@on_gpus(1, 2)
def test_bsp_symm_on_gpus(world_size: int) -> None:
    _assert(run_ranks(_check, world_size, "cuda", timeout=300))
