"""Dispatch on 2 GPUs: tuned (every available variant) and untuned shapes in both layouts equal the fp32
reference; CUDA-graph capture and replay on fresh inputs; ``torch.compile``; and a 2-layer
tensor-parallel MLP (sequence-parallel all-gather + column-parallel GEMM) against plain PyTorch, timed.

    pytest -q tests/runtime/test_dispatch_gpu.py -s      # -s shows the MLP timing line
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

pytestmark = pytest.mark.gpu(world_size=2)

N_BASE, K = 512, 1024


def _init(tables: tuple[str, ...] = (), env_and_shipped: bool = False):
    import autotaxer

    cfg = autotaxer.RuntimeConfig(
        tables=tables, env_tables=env_and_shipped, shipped_tables=env_and_shipped, persist_misses=False
    )
    return autotaxer.init(cfg)


def _key(ctx, m: int, n: int, gd: int):
    from autotaxer import ProblemKey

    return ProblemKey.make(
        "ag_gemm", ctx.target.gpu_model, ctx.world_size, "bf16", {"M": m, "N": n, "K": K}, {"gather_dim": gd}
    )


def _error(ctx, key, seed: int) -> float:
    import autotaxer
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    a, b = op.make_inputs(key, ctx.rank, ctx.device, seed)
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=key["gather_dim"])
    return relative_error(c, op.reference(key, ctx.rank, ctx.device, seed))


def _tuned_table(ctx, path: str) -> list[tuple[str, int]]:
    """One record per available variant and layout (its default params), each at its own N."""
    from autotaxer.ops import get_op
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    op = get_op("ag_gemm")
    records, tuned = [], []
    for i, (name, variant) in enumerate(sorted(op.available_variants(ctx.target).items())):
        n = N_BASE + 64 * i
        for gd in (0, 1):
            key = _key(ctx, 256, n, gd)
            try:
                params = variant.default_params(key, ctx.target)
            except ValueError:
                continue
            records.append(
                WinnerRecord(key, name, params, 5.0, 9.0, 1, arch=ctx.target.arch, num_sms=ctx.target.num_sms)
            )
            tuned.append((name, n))
    write_table(records, path)
    return sorted(set(tuned))


def _tuned_and_untuned(ctx, table_dir: str) -> dict:
    from autotaxer.ops import get_op

    path = f"{table_dir}/rank{ctx.rank}.json"
    tuned = _tuned_table(ctx, path)
    rt = _init((path,))
    op = get_op("ag_gemm")
    out = {}
    for name, n in tuned:
        for gd in (0, 1):
            # tuned M, a near M (nearest record), a far M (BSP); M=127 is valid with gather_dim=1 only
            for m in (256, 384, 64) + ((127,) if gd == 1 else ()):
                key = _key(ctx, m, n, gd)
                errs = [_error(ctx, key, seed) for seed in (1, 2, 3)]
                d = rt.decisions()[key]
                out[(name, n, gd, m)] = (max(errs), op.tolerance(key), d.variant, d.source)
    return out


def test_dispatch_equals_reference_for_tuned_and_untuned_shapes(tmp_path) -> None:
    r0, r1 = run_ranks(_tuned_and_untuned, 2, "cuda", args=(str(tmp_path),), timeout=540)
    assert r0, "no variant was tuned"
    for (name, n, gd, m), (err, tol, variant, source) in r0.items():
        assert err < tol, (name, n, gd, m, variant, err)
        assert r1[(name, n, gd, m)][2:] == (variant, source)  # both ranks ran the same thing
        if m == 256:
            assert (variant, source) == (name, "exact")
        if m == 64:
            assert (variant, source) == ("bsp", "fallback")
    print({k: v[2:] for k, v in r0.items()})


def _graph_and_compile(ctx, table_dir: str) -> dict:
    import torch

    import autotaxer
    from autotaxer.ops import get_op, relative_error

    path = f"{table_dir}/rank{ctx.rank}.json"
    tuned = _tuned_table(ctx, path)
    rt = _init((path,))
    op = get_op("ag_gemm")
    out: dict = {}
    for name, n in tuned:
        for gd in (0, 1):
            key = _key(ctx, 256, n, gd)
            a, b = op.make_inputs(key, ctx.rank, ctx.device, 1)
            static_a, static_b = a.clone(), b.clone()
            autotaxer.dispatch("ag_gemm", static_a, static_b, gather_dim=gd)  # first call: outside capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    autotaxer.dispatch("ag_gemm", static_a, static_b, gather_dim=gd)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = autotaxer.dispatch("ag_gemm", static_a, static_b, gather_dim=gd)
            errs = []
            for seed in (5, 6, 7, 8):  # several replays (epochs) on fresh inputs, no reset
                a, b = op.make_inputs(key, ctx.rank, ctx.device, seed)
                static_a.copy_(a)
                static_b.copy_(b)
                graph.replay()
                torch.cuda.synchronize()
                errs.append(relative_error(static_out, op.reference(key, ctx.rank, ctx.device, seed)))
            out[("graph", name, gd)] = (max(errs), op.tolerance(key), rt.decisions()[key].variant)
    # a shape's first call during capture is refused with a clear error (nothing is half set up)
    key = _key(ctx, 512, N_BASE, 0)
    a, b = op.make_inputs(key, ctx.rank, ctx.device, 1)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        out["first_call_in_capture"] = "no error"
    except RuntimeError as e:
        out["first_call_in_capture"] = str(e)
    torch.cuda.synchronize()
    # torch.compile: the custom op with its fake implementation
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        for gd in (0, 1):
            key = _key(ctx, 256, N_BASE, gd)

            def f(a, b, gd=gd):
                return torch.nn.functional.gelu(autotaxer.dispatch("ag_gemm", a, b, gather_dim=gd))

            compiled = torch.compile(f, backend=backend, fullgraph=True)
            errs = []
            for seed in (9, 10):
                a, b = op.make_inputs(key, ctx.rank, ctx.device, seed)
                got = compiled(a, b)
                ref = torch.nn.functional.gelu(op.reference(key, ctx.rank, ctx.device, seed))
                errs.append(relative_error(got, ref))
            out[("compile", backend, gd)] = (max(errs), op.tolerance(key))
    return out


def test_cuda_graph_replay_and_torch_compile(tmp_path) -> None:
    r0, r1 = run_ranks(_graph_and_compile, 2, "cuda", args=(str(tmp_path),), timeout=540)
    for result in (r0, r1):
        assert "during CUDA graph capture" in result.pop("first_call_in_capture")
        for what, (err, tol, *rest) in result.items():
            assert err < tol, (what, err, rest)


def _mlp(ctx, seq: int, hidden: int, ffn: int) -> dict:
    """Sequence-parallel TP MLP: all-gather x, x @ W1 (column-parallel), gelu, @ W2, reduce-scatter."""
    import torch
    import torch.distributed as dist

    import autotaxer
    from autotaxer.measure import time_variant
    from autotaxer.ops import relative_error
    from autotaxer.runtime.dispatch import get_runtime

    _init(env_and_shipped=True)  # the user's tables: shipped defaults and $AUTOTAXER_TABLE
    ws, dev, dt = ctx.world_size, ctx.device, torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(100 + ctx.rank)
    x = torch.randn(seq // ws, hidden, generator=g, device=dev).to(dt)
    w1 = (torch.randn(hidden, ffn // ws, generator=g, device=dev) / hidden**0.5).to(dt)
    w2 = (torch.randn(ffn // ws, hidden, generator=g, device=dev) / ffn**0.5).to(dt)
    full = torch.empty(seq, hidden, device=dev, dtype=dt)
    out_plain = torch.empty(seq // ws, hidden, device=dev, dtype=dt)
    out_disp = torch.empty_like(out_plain)

    def plain():
        dist.all_gather_into_tensor(full, x)
        h = torch.nn.functional.gelu(full @ w1)
        dist.reduce_scatter_tensor(out_plain, h @ w2)

    def with_dispatch():
        h = torch.nn.functional.gelu(autotaxer.dispatch("ag_gemm", x, w1, gather_dim=0))
        dist.reduce_scatter_tensor(out_disp, h @ w2)

    plain()
    with_dispatch()
    torch.cuda.synchronize()
    err = relative_error(out_disp, out_plain)
    t_plain = time_variant(plain, ctx, warmup=5, iters=20)
    t_disp = time_variant(with_dispatch, ctx, warmup=5, iters=20)
    decision = get_runtime().decisions()
    return {
        "err": err,
        "plain_us": t_plain,
        "dispatch_us": t_disp,
        "variant": [d.variant for d in decision.values()],
    }


@pytest.mark.parametrize(("seq", "hidden", "ffn"), [(4096, 4096, 14336)])
def test_tensor_parallel_mlp_matches_plain_pytorch(seq: int, hidden: int, ffn: int) -> None:
    r0, r1 = run_ranks(_mlp, 2, "cuda", args=(seq, hidden, ffn), timeout=540)
    for r in (r0, r1):
        assert r["err"] < 1e-2, r
    print(
        f"\nTP MLP seq={seq} hidden={hidden} ffn={ffn} bf16 2 GPUs: plain PyTorch {r0['plain_us']:.1f} us, "
        f"dispatch ({r0['variant']}) {r0['dispatch_us']:.1f} us, "
        f"ratio {r0['plain_us'] / r0['dispatch_us']:.3f}x"
    )
