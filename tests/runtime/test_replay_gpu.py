"""Copy-engine calls served as CUDA-graph replays on 2 GPUs (:mod:`autotaxer.runtime.replay`): through
``autotaxer.dispatch``, ``ag_gemm`` (both gather dims) and ``gemm_rs`` ``copy_engine`` (each signalling
back end) equal the fp32 reference on fresh inputs, NaN-poisoned outputs, with values changed in place
between calls, two results kept, a non-contiguous input, and inside the user's own CUDA graph capture
(launched eagerly there, replayed by the user's graph); the calls were replays (captures and replays
counted), and replays and eager launches interleave on one channel."""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

pytestmark = pytest.mark.gpu(world_size=2)


def _cases(ctx):
    from autotaxer import ProblemKey

    def key(op, layout, m=1024, n=1000, k=1544):
        shape = {"M": m, "N": n, "K": k}
        return ProblemKey.make(op, ctx.target.gpu_model, ctx.world_size, "bf16", shape, layout)

    return [
        (key("ag_gemm", {"gather_dim": 0}), "memop"),
        (key("ag_gemm", {"gather_dim": 1}), "triton"),
        (key("gemm_rs", {"scatter_dim": 0}, k=2048), "memop"),
        (key("gemm_rs", {"scatter_dim": 0}, k=2048), "triton"),
    ]


def _one(ctx, rt, key, signal) -> dict:
    """One key served by ``copy_engine`` with ``signal``: the errors of every call and the replay counts."""
    import torch

    import autotaxer
    from autotaxer.ops import get_op, relative_error
    from autotaxer.runtime.lookup import EXACT, Decision
    from autotaxer.runtime.replay import ReplayedRun

    op = get_op(key.op)
    variant = op.variants["copy_engine"]
    params = {**variant.seed_configs(key, rt.ctx.target)[0], "signal": signal}
    rt.serve_decision(key, Decision("copy_engine", params, EXACT, 0.0, key))
    layout = {f: v for f, v in key.layout if f in ("gather_dim", "scatter_dim")}
    errs: list[float] = []

    def call(inputs, out=None):
        return autotaxer.dispatch(key.op, *inputs, out=out, **layout)

    def err(got, seed):
        return relative_error(got, op.reference(key, ctx.rank, ctx.device, seed))

    # values changed in place, the same tensors every call (one argument set: replays)
    a, b = op.make_inputs(key, ctx.rank, ctx.device, 1)
    out = op.empty_output(key, ctx.device)
    for seed in (1, 2, 3):
        fresh = op.make_inputs(key, ctx.rank, ctx.device, seed)
        a.copy_(fresh[0])
        b.copy_(fresh[1])
        out.fill_(float("nan"))
        errs.append(err(call((a, b), out), seed))
    # new tensors, every result kept (fresh outputs, other addresses)
    kept = [(seed, call(op.make_inputs(key, ctx.rank, ctx.device, seed))) for seed in (4, 5, 6)]
    errs += [err(got, seed) for seed, got in kept]
    # a non-contiguous A (its transpose's transpose): copied to a layout the variant reads first
    a7, b7 = op.make_inputs(key, ctx.rank, ctx.device, 7)
    errs.append(err(call((a7.t().contiguous().t(), b7)), 7))
    run = rt.plan(key.op, a, b, **layout).run
    stats = run.stats() if isinstance(run, ReplayedRun) else None
    # inside the user's CUDA graph: launched eagerly into it, replayed by it
    static = op.make_inputs(key, ctx.rank, ctx.device, 8)
    static_out = op.empty_output(key, ctx.device)
    call(static, static_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(static, static_out)
    for seed in (9, 10):
        fresh = op.make_inputs(key, ctx.rank, ctx.device, seed)
        for s, f in zip(static, fresh, strict=True):
            s.copy_(f)
        static_out.fill_(float("nan"))
        graph.replay()
        errs.append(err(static_out, seed))
    # and a replayed call after the user's graph, on the same channel
    errs.append(err(call(op.make_inputs(key, ctx.rank, ctx.device, 11)), 11))
    torch.cuda.synchronize()
    after = run.stats() if isinstance(run, ReplayedRun) else None
    return {"errs": errs, "tol": op.tolerance(key), "stats": stats, "after": after}


def _check(ctx) -> dict:
    import autotaxer
    from autotaxer.runtime.dispatch import runtime_for

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    rt = runtime_for(None)
    rt.load(ctx.device)
    return {f"{key.text} {signal}": _one(ctx, rt, key, signal) for key, signal in _cases(ctx)}


def test_copy_engine_calls_are_replayed_and_equal_the_reference() -> None:
    r0, r1 = run_ranks(_check, 2, "cuda", timeout=400)
    for result in (r0, r1):
        for label, got in result.items():
            assert all(e < got["tol"] for e in got["errs"]), (label, got)  # NaN fails too
            stats = got["stats"]
            assert stats is not None, f"{label}: the served call was not a ReplayedRun"
            assert stats["off"] is None, (label, stats)
            assert stats["replays"] >= 5 and stats["captures"] >= 4, (label, stats)
            assert got["after"]["replays"] == stats["replays"] + 2, (label, got["after"])
