"""``torch_fused`` (PyTorch's own fused all-gather-matmul and matmul-reduce-scatter) on GPUs, for both
ops: right against fp32 in every layout with two results kept, the gathered A it hands to autograd equal
to the gathered shards, and unavailable, with the reason, once NCCL's symmetric-memory backend is chosen."""

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
    from autotaxer.ops import _symm_backend, get_op, relative_error

    found = {}
    for op_name, shape, dim_field in CASES:
        op = get_op(op_name)
        variant = op.variants["torch_fused"]
        assert variant.unavailable_reason(ctx.target) is None
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
                inputs = op.make_inputs(key, ctx.rank, ctx.device, 3)
                c, saved = variant.run_for_backward(ws, inputs, ctx)
                torch.cuda.synchronize()
                errs = [relative_error(c, op.reference(key, ctx.rank, ctx.device, s)) for s, c in results]
                errs.append(relative_error(c, op.reference(key, ctx.rank, ctx.device, 3)))
                if op_name == "ag_gemm":  # the gathered A: every rank's shard in place
                    shards = [op.make_inputs(key, r, ctx.device, 3)[0] for r in range(ctx.world_size)]
                    errs.append(relative_error(saved, torch.cat(shards, dim=dim)))
                found[(op_name, dim, layout)] = (max(errs), len({c.data_ptr() for _, c in results}))
    _symm_backend.select("nccl")
    found["nccl"] = get_op("ag_gemm").variants["torch_fused"].unavailable_reason(ctx.target)
    return found


def _assert(results: list[dict]) -> None:
    for per_rank in results:
        assert "AUTOTAXER_SYMM_MEM=nccl" in per_rank.pop("nccl")
        for case, (err, distinct) in per_rank.items():
            assert err < 1e-2, (case, err)
            assert distinct == 2, case


@pytest.mark.gpu
def test_torch_fused_on_one_gpu() -> None:
    _assert(run_ranks(_check, 1, "cuda", timeout=300))


@pytest.mark.gpu(world_size=2)
def test_torch_fused_on_two_gpus() -> None:
    _assert(run_ranks(_check, 2, "cuda", timeout=300))
