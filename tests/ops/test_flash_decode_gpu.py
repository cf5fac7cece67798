"""flash_decode on 2 GPUs: every variant against the fp32 reference, eager and under CUDA-graph replay.

Each rank runs several consecutive calls on one workspace (the fused variant's epochs and parity
slots advance without any reset) with fresh seeds, ragged and full row lengths, and NaN-poisoned
outputs, for B in {1, 8}, S in {8k, 32k}, D in {64, 128}.
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

CALLS = 3


def _key(ctx, b: int, s: int, d: int, dtype: str):
    from autotaxer._problem import ProblemKey

    shape = {"B": b, "H": 32, "Hkv": 8, "D": d, "S": s}
    return ProblemKey.make("flash_decode", ctx.target.gpu_model, ctx.world_size, dtype, shape)


def _param_sets(variant, key, target) -> list[dict]:
    """The default configuration and a small, different one (1-stage pipeline, few splits)."""
    default = variant.default_params(key, target)
    small = dict(default, block_n=32, splits=3, num_warps=8, num_stages=1)
    return [default] if variant.check(key, target, small) is not None else [default, small]


def _check_all_variants(ctx, shapes: tuple[tuple[int, int, int, str], ...]) -> list[tuple]:
    import torch

    from autotaxer.ops import get_op, relative_error

    op = get_op("flash_decode")
    results = []
    for b, s, d, dtype in shapes:
        key = _key(ctx, b, s, d, dtype)
        for name, variant in sorted(op.available_variants(ctx.target).items()):
            for params in _param_sets(variant, key, ctx.target):
                ws = variant.prepare(key, params, ctx)
                for call in range(CALLS):
                    seed = 1000 * call + 17 * b + s // 1024 + d
                    mode = "uneven" if call != 1 else "full"
                    inputs = op.make_inputs(key, ctx.rank, ctx.device, seed, lengths=mode)
                    if mode == "full" and call % 2:
                        inputs = inputs[:3]  # no lengths tensor: every position valid
                    out = op.empty_output(key, ctx.device)
                    variant.run(ws, inputs, ctx, out=out)
                    torch.cuda.synchronize(ctx.device)
                    err = relative_error(out, op.reference(key, ctx.rank, ctx.device, seed, lengths=mode))
                    results.append((name, str(params), key.shape_text, dtype, call, err, op.tolerance(key)))
                del ws
    return results


def _check_graph_replay(ctx, b: int, s: int, d: int) -> list[tuple]:
    """Capture one call per variant in a CUDA graph, replay it on new inputs copied into the captured ones."""
    import torch
    import torch.distributed as dist

    from autotaxer.ops import get_op, relative_error

    op = get_op("flash_decode")
    key = _key(ctx, b, s, d, "bf16")
    results = []
    for name, variant in sorted(op.available_variants(ctx.target).items()):
        ws = variant.prepare(key, variant.default_params(key, ctx.target), ctx)
        static = op.make_inputs(key, ctx.rank, ctx.device, 1, lengths="uneven")
        out = op.empty_output(key, ctx.device)
        side = torch.cuda.Stream(device=ctx.device)
        side.wait_stream(torch.cuda.current_stream(ctx.device))
        with torch.cuda.stream(side):
            variant.run(ws, static, ctx, out=out)  # warm-up: compiles, NCCL communicators
        torch.cuda.current_stream(ctx.device).wait_stream(side)
        torch.cuda.synchronize(ctx.device)
        dist.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            variant.run(ws, static, ctx, out=out)
        for call in range(CALLS):
            seed = 50 + call
            fresh = op.make_inputs(key, ctx.rank, ctx.device, seed, lengths="uneven")
            for dst, src in zip(static, fresh, strict=True):
                dst.copy_(src)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize(ctx.device)
            err = relative_error(out, op.reference(key, ctx.rank, ctx.device, seed, lengths="uneven"))
            results.append((name, "graph", key.shape_text, "bf16", call, err, op.tolerance(key)))
        del graph, ws
    return results


def _assert_all_pass(per_rank: list[list[tuple]], min_variants: int) -> None:
    rows = [row for rank_rows in per_rank for row in rank_rows]
    assert rows, "no variant ran"
    assert len({row[0] for row in rows}) >= min_variants, rows
    bad = [row for row in rows if not row[5] <= row[6]]
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
def test_every_variant_matches_reference_bf16() -> None:
    shapes = tuple((b, s, d, "bf16") for b in (1, 8) for s in (8192, 32768) for d in (64, 128))
    _assert_all_pass(run_ranks(_check_all_variants, 2, "cuda", args=(shapes,), timeout=900), 2)


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
def test_every_variant_matches_reference_fp16_fp32() -> None:
    shapes = ((1, 8192, 64, "fp16"), (8, 8192, 128, "fp32"))
    _assert_all_pass(run_ranks(_check_all_variants, 2, "cuda", args=(shapes,), timeout=600), 2)


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
def test_every_variant_survives_cuda_graph_replay() -> None:
    _assert_all_pass(run_ranks(_check_graph_replay, 2, "cuda", args=(8, 8192, 128), timeout=600), 2)
