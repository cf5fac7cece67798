"""``bsp_symm`` (NCCL symmetric-memory all-gather / reduce-scatter) on GPUs, for ``ag_gemm`` and ``gemm_rs``:
available where NCCL has symmetric windows, right against fp32 in every layout with two results kept, and
measured by the tuner beside ``bsp`` (a BSP form)."""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

CASES = [
    ("ag_gemm", {"M": 512, "N": 640, "K": 512}, "gather_dim"),
    ("gemm_rs", {"M": 512, "N": 768, "K": 1024}, "scatter_dim"),
]


def _check(ctx) -> dict:
    import torch

    from autotaxer import ProblemKey
    from autotaxer.ops import get_op, relative_error
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
        for dim in (0, 1):
            for layout in ("kn", "nk"):
                key = ProblemKey.make(
                    op_name, ctx.target.gpu_model, ctx.world_size, "bf16", shape,
                    {dim_field: dim, "b_layout": layout},
                )  # fmt: skip
                ws = variant.prepare(key, {}, ctx)
                results = [
                    (s, variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, s), ctx)) for s in (1, 2)
                ]
                torch.cuda.synchronize()
                errs = [relative_error(c, op.reference(key, ctx.rank, ctx.device, s)) for s, c in results]
                found[(op_name, dim, layout)] = (max(errs), len({c.data_ptr() for _, c in results}))
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


@pytest.mark.gpu
def test_bsp_symm_on_one_gpu() -> None:
    _assert(run_ranks(_check, 1, "cuda", timeout=300))


@pytest.mark.gpu(world_size=2)
def test_bsp_symm_on_two_gpus() -> None:
    _assert(run_ranks(_check, 2, "cuda", timeout=300))
