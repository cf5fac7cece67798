"""``copy_engine`` on 2 GPUs: both layouts, bf16/fp16, odd N/K, every signalling back end.

Each configuration is prepared once and called several times in a row (flags never reset) on fresh
inputs with a NaN-poisoned output; then one call is captured in a CUDA graph and replayed on fresh
inputs copied into the captured input buffers; then an eager call checks the epochs stayed in step; then
three calls that keep the gathered A (``run_for_backward`` through the saving launcher: replayed after
the first), their outputs and gathered A checked once all three ran.
"""

from __future__ import annotations

import pytest
from _factories import rank_key

from autotaxer.testing import run_ranks

N, K = 1000, 1544  # not multiples of 128; K/2 = 772


def _cases() -> list[tuple[int, int, str, dict]]:
    cases = []
    for gd, ms in ((0, (8, 64, 1024, 4096)), (1, (8, 64, 127, 1024, 4096))):
        for m in ms:
            for dtype in ("bf16", "fp16"):
                for signal in ("memop", "triton"):
                    base = {"signal": signal, "order": "rotated", "gather_first": False, "accumulate": "out"}
                    cases.append((gd, m, dtype, {**base, "chunks": 1}))
                    cases.append((gd, m, dtype, {**base, "chunks": 4}))
                    if gd == 0:
                        cases.append((gd, m, dtype, {**base, "chunks": 1, "gather_first": True}))
                    else:
                        cases.append((gd, m, dtype, {**base, "chunks": 2, "accumulate": "fp32"}))
    return cases


def _run_cases(ctx, cases) -> list[tuple[str, str, float]]:
    import torch

    from autotaxer.ops import get_op, relative_error
    from autotaxer.runtime.replay import saving_launcher

    op = get_op("ag_gemm")
    variant = op.variants["copy_engine"]
    results = []
    seed = 100
    for gd, m, dtype, params in cases:
        key = rank_key(ctx, m, N, K, gd, dtype)
        label = f"gd={gd} M={m} {dtype} {params}"
        reason = variant.check(key, ctx.target, params)
        if reason is not None:
            results.append((label, f"invalid: {reason}", float("inf")))
            continue
        ws = variant.prepare(key, params, ctx)
        tol = op.tolerance(key)
        for _ in range(3):  # consecutive calls, no reset in between
            seed += 1
            out = op.empty_output(key, ctx.device)
            variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, seed), ctx, out=out)
            err = relative_error(out, op.reference(key, ctx.rank, ctx.device, seed))
            results.append((label, "eager", err))
        # CUDA graph: capture one call on static inputs, replay on fresh data.
        static = op.make_inputs(key, ctx.rank, ctx.device, seed)
        static_out = op.empty_output(key, ctx.device)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            variant.run(ws, static, ctx, out=static_out)
        for _ in range(3):
            seed += 1
            for dst, src in zip(static, op.make_inputs(key, ctx.rank, ctx.device, seed), strict=True):
                dst.copy_(src)
            static_out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            err = relative_error(static_out, op.reference(key, ctx.rank, ctx.device, seed))
            results.append((label, "graph", err))
        seed += 1
        out = op.empty_output(key, ctx.device)
        variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, seed), ctx, out=out)
        results.append(
            (label, "eager after graph", relative_error(out, op.reference(key, ctx.rank, ctx.device, seed)))
        )
        del graph
        # Calls that keep the gathered A, through the saving launcher (the first eager, then replays),
        # every result kept until all ran.
        saving = saving_launcher(op, variant, ctx.device)
        kept = []
        for _ in range(3):
            seed += 1
            kept.append((seed, saving(ws, op.make_inputs(key, ctx.rank, ctx.device, seed), ctx)))
        for s, (c, gathered) in kept:
            shards = [op.make_inputs(key, r, ctx.device, s)[0].float() for r in range(ctx.world_size)]
            results.append((label, "saving", relative_error(c, op.reference(key, ctx.rank, ctx.device, s))))
            results.append((label, "gathered", relative_error(gathered, torch.cat(shards, dim=gd))))
        results.append((label, "tol", tol))
    torch.cuda.synchronize()
    return results


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("gather_dim", [0, 1])
def test_copy_engine_matches_reference(gather_dim: int) -> None:
    cases = [c for c in _cases() if c[0] == gather_dim]
    per_rank = run_ranks(_run_cases, 2, "cuda", args=(cases,), timeout=600)
    bad = []
    for rank, results in enumerate(per_rank):
        tol = {label: e for label, what, e in results if what == "tol"}
        for label, what, err in results:
            if what == "tol":
                continue
            if what.startswith("invalid") or not err <= tol[label]:
                bad.append(f"rank {rank} {label} {what}: {err}")
    assert not bad, "\n".join(bad[:40])
    assert sum(1 for _, what, _ in per_rank[0] if what == "graph") >= len(cases) * 3
    assert sum(1 for _, what, _ in per_rank[0] if what == "gathered") == len(cases) * 3
