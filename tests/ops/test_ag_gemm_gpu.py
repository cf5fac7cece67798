"""Every ag_gemm variant on 2 (and 4) GPUs against the fp32 reference.

Fresh random inputs per call, NaN-poisoned outputs, several consecutive calls on one workspace (the
fused variants' flags are never reset: epochs), then a CUDA graph captured once and replayed with new
inputs copied into its static tensors (the epoch must advance on the device). N and K are not
multiples of the tile sizes; M covers one row per rank up to several waves of tiles.
"""

from __future__ import annotations

import pytest
from _factories import rank_key

from autotaxer.testing import run_ranks

N, K = 1000, 1000  # not multiples of any tile; K/2 = 500 is not 16-byte aligned in bf16
CASES = [(gd, m) for gd in (0, 1) for m in (8, 64, 1024, 4096)] + [(1, 127)]


def _assert_ranks_pass(check, world_size: int, args: tuple, timeout: float) -> None:
    """Run ``check`` on ``world_size`` GPU ranks; fail with the first 20 failures every rank returned."""
    results = run_ranks(check, world_size, "cuda", args=args, timeout=timeout)
    failures = [f for per_rank in results for f in per_rank]
    assert not failures, "\n".join(failures[:20])


def _configs(variant, key, target, seeds: bool = False) -> list[dict]:
    """The default configuration and one more valid one, different tiles and chunking; with ``seeds``
    also the variant's seed configurations (the tuner's and the benchmark's starting points)."""
    from autotaxer.ops import iter_grid

    first = variant.default_params(key, target)
    configs = [first]
    space = variant.search_space(key, target)
    for params in iter_grid(space):
        if variant.check(key, target, params) is None and all(
            params[f] != first[f] for f in ("block_n", "comm_sms", "k_chunks") if f in first
        ):
            configs.append(params)
            break
    if seeds:
        configs += [
            c
            for c in variant.seed_configs(key, target)
            if c not in configs and variant.check(key, target, c) is None
        ]
    return configs


def _check_all(
    ctx,
    dtype: str,
    calls: int,
    only: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    seeds: bool | None = None,
    shape: tuple[int, int] = (N, K),
    b_layout: str = "kn",
) -> list[str]:
    """Every selected variant at each case of ``CASES`` (``shape``: N, K; ``b_layout`` of B): ``calls``
    eager calls and three graph replays per configuration; ``seeds`` (default: bf16 only) adds each
    variant's seed configurations."""
    import torch

    from autotaxer import ProblemKey
    from autotaxer.ops import get_op, iter_grid, relative_error

    op = get_op("ag_gemm")
    failures = []
    seed = 0
    for name, variant in sorted(op.available_variants(ctx.target).items()):
        if (only and name not in only) or name in skip:
            continue
        for gd, m in CASES:
            key = rank_key(ctx, m, *shape, gd, dtype)
            if b_layout != "kn":
                key = ProblemKey.make("ag_gemm", key.gpu_model, key.world_size, dtype, dict(key.shape),
                                      {"gather_dim": gd, "b_layout": b_layout})  # fmt: skip
            space = variant.search_space(key, ctx.target)
            if space and not any(variant.check(key, ctx.target, p) is None for p in iter_grid(space)):
                continue  # nothing valid at this world size (ce_fanout at 2 ranks)
            for params in (
                _configs(variant, key, ctx.target, seeds=dtype == "bf16" if seeds is None else seeds)
                if variant.search_space(key, ctx.target)
                else [{}]
            ):
                ws = variant.prepare(key, params, ctx)
                tol = op.tolerance(key)
                for call in range(calls):
                    seed += 1
                    inputs = op.make_inputs(key, ctx.rank, ctx.device, seed)
                    out = op.empty_output(key, ctx.device)
                    variant.run(ws, inputs, ctx, out=out)
                    torch.cuda.synchronize()
                    err = relative_error(out, op.reference(key, ctx.rank, ctx.device, seed))
                    if not err < tol:
                        failures.append(f"{name} {key.text} {params} call {call}: rel err {err}")
                # CUDA graph: capture one call on static tensors, replay with fresh inputs.
                seed += 1
                static_in = op.make_inputs(key, ctx.rank, ctx.device, seed)
                static_out = op.empty_output(key, ctx.device)
                stream = torch.cuda.Stream()
                torch.cuda.synchronize()
                torch.distributed.barrier()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                    variant.run(ws, static_in, ctx, out=static_out)
                # Capture launches nothing: the epoch on the device has not moved.
                for replay in range(3):
                    seed += 1
                    for dst, src in zip(
                        static_in, op.make_inputs(key, ctx.rank, ctx.device, seed), strict=True
                    ):
                        dst.copy_(src)
                    static_out.fill_(float("nan"))
                    torch.cuda.synchronize()
                    torch.distributed.barrier()
                    graph.replay()
                    torch.cuda.synchronize()
                    err = relative_error(static_out, op.reference(key, ctx.rank, ctx.device, seed))
                    if not err < tol:
                        failures.append(f"{name} {key.text} {params} graph replay {replay}: rel err {err}")
                del graph
    return failures


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_variant_matches_reference_on_two_gpus(dtype: str) -> None:
    _assert_ranks_pass(_check_all, 2, (dtype, 3, (), _IRIS_FUSED), timeout=900)


_IRIS_FUSED = ("pull", "push", "push_tma", "push_ws", "push_ws_fwd")


@pytest.mark.gpu(world_size=4)
@pytest.mark.slow
def test_every_variant_matches_reference_on_four_gpus() -> None:
    """World size 4: three peers' producers and flags, four shards per inbox, three copy-engine peers;
    every available variant at its default and one more configuration, bf16."""
    _assert_ranks_pass(_check_all, 4, ("bf16", 2, (), (), False), timeout=900)


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_ce_persistent_matches_reference_on_two_gpus(b_layout: str) -> None:
    """``ce_persistent`` (issue 47) at its default, one more configuration and every seed, both weight
    layouts, eager calls and CUDA-graph replays (also in the every-variant tests above, at ``kn``)."""
    args = ("bf16", 3, ("ce_persistent",), (), True, (N, K), b_layout)
    _assert_ranks_pass(_check_all, 2, args, timeout=600)


@pytest.mark.gpu(world_size=4)
@pytest.mark.slow
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("variant", ["ce_persistent", "ce_local_rest"])
def test_issue47_variant_matches_reference_on_four_gpus(variant: str, b_layout: str) -> None:
    """Issue 47's variants at world size 4, their default, one more configuration and every seed, both
    weight layouts, eager calls and CUDA-graph replays. ``ce_persistent``: three peers' copies on one or
    several side streams, the tiles of four shards. ``ce_local_rest``: the rotated inbox slots, the first
    and last ranks' peers' GEMM straight into ``out``, the middle ranks' through the scratch."""
    args = ("bf16", 2, (variant,), (), True, (N, K), b_layout)
    _assert_ranks_pass(_check_all, 4, args, timeout=900)


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("variant", _IRIS_FUSED)
def test_iris_fused_variant_matches_reference_on_two_gpus(variant: str, dtype: str) -> None:
    _assert_ranks_pass(_check_all, 2, (dtype, 3, (variant,)), timeout=300)


def _misaligned_inputs(ctx, variant_name: str) -> list[str]:
    """A call on a 16-byte-aligned shard, then on a misaligned view of the same values, then aligned
    again, on one workspace: the compiled-launch cache must not serve one specialisation to the other."""
    import torch

    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    variant = op.variants[variant_name]
    failures = []
    for gd in (0, 1):
        key = rank_key(ctx, 256, N, K, gd, "bf16")
        ws = variant.prepare(key, variant.default_params(key, ctx.target), ctx)
        for call, shift in enumerate((0, 1, 0, 1)):
            a, b = op.make_inputs(key, ctx.rank, ctx.device, 100 + call)
            if shift:
                store = torch.empty(a.numel() + shift, dtype=a.dtype, device=a.device)
                a = store[shift:].view(a.shape).copy_(a)  # data_ptr % 16 == 2
            out = op.empty_output(key, ctx.device)
            variant.run(ws, (a, b), ctx, out=out)
            torch.cuda.synchronize()
            err = relative_error(out, op.reference(key, ctx.rank, ctx.device, 100 + call))
            if not err < op.tolerance(key):
                failures.append(f"{variant_name} gd={gd} call {call} shift {shift}: rel err {err}")
        launches = [k for k in ws.buffers["launch_cache"] if isinstance(k, tuple)]  # (push_tma: + scratch)
        if len(launches) != 2:
            failures.append(f"{variant_name} gd={gd}: {len(launches)} cached launches, not 2")
    return failures


@pytest.mark.gpu(world_size=2)
@pytest.mark.parametrize("variant", _IRIS_FUSED)
def test_launch_cache_keeps_alignments_apart(variant: str) -> None:
    _assert_ranks_pass(_misaligned_inputs, 2, (variant,), timeout=300)


def _own_kernel_ready(name: str, a, b, box, gd: int, params: dict) -> bool:
    """Whether ``name`` (``push_tma``, ``push_ws``, ``push_ws_fwd``) runs its own kernel on these tensors,
    not ``push``'s."""
    from autotaxer.kernels.ag_gemm.fused import FusedConfig

    config = FusedConfig(**params)
    if name == "push_tma":
        from autotaxer.kernels.ag_gemm.push_tma import tma_ready

        return tma_ready(a, b, box, gd, config) is None
    from autotaxer.kernels.ag_gemm.experimental.push_ws import ws_config
    from autotaxer.kernels.ag_gemm.experimental.ws import tensors_error, ws_config_error

    return (ws_config_error(ws_config(config)) or tensors_error(a, b, box, gd, ws_config(config))) is None


def _check_own_kernel(ctx, name: str) -> list[str]:
    """``name`` where TMA can address every tensor (K=1024: 16-byte K-slices at gather_dim=1; N=1000
    still ragged), so its own kernel runs, not ``push``'s fallback: the cases, then a count of them."""
    import torch

    from autotaxer.ops import get_op

    failures = _check_all(ctx, "bf16", 2, (name,), shape=(1000, 1024))
    op, own_cases = get_op("ag_gemm"), 0
    variant = op.variants[name]
    for gd, m in CASES:
        key = rank_key(ctx, m, 1000, 1024, gd, "bf16")
        try:
            params = variant.default_params(key, ctx.target)
        except ValueError:  # no valid configuration (gather_dim=0 tiles straddling at M=8)
            continue
        a, b = op.make_inputs(key, ctx.rank, ctx.device, 1)
        box = torch.empty(2, ctx.world_size, *a.shape, dtype=a.dtype, device=a.device)
        own_cases += _own_kernel_ready(name, a, b, box, gd, params)
    if own_cases < 3:
        failures.append(f"{name}: its own kernel ran in only {own_cases} of the {len(CASES)} cases")
    return failures


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["push_tma", "push_ws", "push_ws_fwd"])
def test_tma_variant_runs_its_own_kernel_on_two_gpus(variant: str) -> None:
    _assert_ranks_pass(_check_own_kernel, 2, (variant,), timeout=300)
