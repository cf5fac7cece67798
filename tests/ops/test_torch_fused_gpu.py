"""``torch_fused`` (PyTorch's own fused all-gather-matmul and matmul-reduce-scatter) on GPUs, for both
ops: right against fp32 in every layout with two results kept, the gathered A it hands to autograd equal
to the gathered shards, and unavailable, with the reason, once NCCL's symmetric-memory backend is chosen."""

from __future__ import annotations

from _factories import kept_errors, kept_results, layout_keys, on_gpus

from autotaxer.testing import run_ranks

CASES = [
    ("ag_gemm", {"M": 512, "N": 640, "K": 512}, "gather_dim"),
    ("gemm_rs", {"M": 512, "N": 768, "K": 1024}, "scatter_dim"),
]


def _check(ctx) -> dict:
    import torch

    from autotaxer.ops import _symm_backend, get_op, relative_error

    found = {}
    for op_name, shape, dim_field in CASES:
        op = get_op(op_name)
        variant = op.variants["torch_fused"]
        assert variant.unavailable_reason(ctx.target) is None
        for dim, layout, key in layout_keys(ctx, op_name, shape, dim_field):
            ws = variant.prepare(key, {}, ctx)
            results = kept_results(op, variant, ws, key, ctx)
            inputs = op.make_inputs(key, ctx.rank, ctx.device, 3)
            c, saved = variant.run_for_backward(ws, inputs, ctx)
            errs, distinct = kept_errors(op, key, ctx, results)  # after the third call: both still right
            errs.append(relative_error(c, op.reference(key, ctx.rank, ctx.device, 3)))
            if op_name == "ag_gemm":  # the gathered A: every rank's shard in place
                shards = [op.make_inputs(key, r, ctx.device, 3)[0] for r in range(ctx.world_size)]
                errs.append(relative_error(saved, torch.cat(shards, dim=dim)))
            found[(op_name, dim, layout)] = (max(errs), distinct)
    _symm_backend.select("nccl")
    found["nccl"] = get_op("ag_gemm").variants["torch_fused"].unavailable_reason(ctx.target)
    return found


def _assert(results: list[dict]) -> None:
    for per_rank in results:
        assert "AUTOTAXER_SYMM_MEM=nccl" in per_rank.pop("nccl")
        for case, (err, distinct) in per_rank.items():
            assert err < 1e-2, (case, err)
            assert distinct == 2, case


@on_gpus(1, 2)
def test_torch_fused_on_gpus(world_size: int) -> None:
    _assert(run_ranks(_check, world_size, "cuda", timeout=300))
