"""``gemm_rs`` on GPUs: dispatch in both scatter dims and weight layouts (two results kept alive) and
gradients against plain PyTorch in fp32, at world size 1 and on 2 GPUs."""

from __future__ import annotations

from _factories import kept_errors, kept_results, layout_keys, on_gpus

from autotaxer.testing import run_ranks

SHAPE = {"M": 512, "N": 768, "K": 1024}


def _check(ctx) -> dict:
    import torch

    import autotaxer
    from autotaxer.ops import get_op, relative_error

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    op, ws, r, out = get_op("gemm_rs"), ctx.world_size, ctx.rank, {}
    for sd, layout, key in layout_keys(ctx, "gemm_rs", SHAPE, "scatter_dim"):
        a1, b1 = op.make_inputs(key, r, ctx.device, 1)
        a2, b2 = op.make_inputs(key, r, ctx.device, 2)
        c1 = autotaxer.dispatch("gemm_rs", a1, b1, scatter_dim=sd)
        c2 = autotaxer.dispatch("gemm_rs", a2, b2, scatter_dim=sd)
        a = a1.clone().requires_grad_()
        b = b1.detach().clone().requires_grad_()
        gen = torch.Generator(device=ctx.device).manual_seed(9)
        g = torch.randn(c1.shape, device=ctx.device, generator=gen)
        (autotaxer.dispatch("gemm_rs", a, b, scatter_dim=sd).float() * g).sum().backward()
        # each rank weighs its own slice by the same g: grad_a = gathered(g) b^T, grad_b = a^T gathered(g)
        gathered = [torch.empty_like(g) for _ in range(ws)]
        if ws > 1:
            torch.distributed.all_gather(gathered, g)
        else:
            gathered = [g]
        full_g = torch.cat(gathered, dim=sd)
        out[(sd, layout)] = (
            relative_error(c1, op.reference(key, r, ctx.device, 1)),
            relative_error(c2, op.reference(key, r, ctx.device, 2)),
            relative_error(a.grad, full_g @ b1.float().t()),
            relative_error(b.grad, a1.float().t() @ full_g),
        )
    return out


@on_gpus(1, 2)
def test_gemm_rs_on_gpus(world_size: int) -> None:
    for per_rank in run_ranks(_check, world_size, "cuda", timeout=300):
        for case, errs in per_rank.items():
            assert max(errs) < 1e-2, (case, errs)


def _every_variant(ctx) -> dict:
    """Every available gemm_rs variant (its first seed, else its default), both scatter dims and layouts:
    two calls with fresh inputs, both results kept, each against fp32; the output is never a buffer the
    variant keeps."""
    from autotaxer.ops import get_op

    op, found = get_op("gemm_rs"), {}
    for name, variant in sorted(op.available_variants(ctx.target).items()):
        for sd, layout, key in layout_keys(ctx, "gemm_rs", SHAPE, "scatter_dim"):
            seeds = variant.seed_configs(key, ctx.target)
            seeds = [c for c in seeds if variant.check(key, ctx.target, c) is None]
            if not seeds:
                try:
                    seeds = [variant.default_params(key, ctx.target)]
                except ValueError:
                    continue  # no valid configuration at this world size (copy_engine needs peers)
            ws = variant.prepare(key, seeds[0], ctx)
            errs, distinct = kept_errors(op, key, ctx, kept_results(op, variant, ws, key, ctx))
            found[(name, sd, layout)] = (max(errs), distinct)
    return found


def _assert_every_variant(results: list[dict]) -> set[str]:
    names = set()
    for per_rank in results:
        for case, (err, distinct) in per_rank.items():
            assert err < 1e-2, (case, err)
            assert distinct == 2, case
            names.add(case[0])
    return names


@on_gpus(1, 2, 4)
def test_every_variant_on_gpus(world_size: int) -> None:
    names = _assert_every_variant(run_ranks(_every_variant, world_size, "cuda", timeout=300))
    peers = {"copy_engine"} if world_size > 1 else set()  # copy_engine needs peers
    assert {"bsp", "push"} | peers <= names, names
