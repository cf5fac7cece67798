"""What a tensor-parallel model needs of every ``ag_gemm`` variant on GPUs: fresh outputs (two results of
one shape kept alive), nn.Linear's transposed weight, the gathered A handed to autograd, gradients
through dispatch and ``ColumnParallelLinear`` against plain PyTorch, and the custom op.

World size 1 runs on one GPU (the variants that run alone); 2 and 4 GPUs add the peers' variants.
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

N, K = 640, 512


def _key(ctx, m: int, gd: int, layout: str):
    from autotaxer import ProblemKey

    return ProblemKey.make(
        "ag_gemm", ctx.target.gpu_model, ctx.world_size, "bf16", {"M": m, "N": N, "K": K},
        {"gather_dim": gd, "b_layout": layout},
    )  # fmt: skip


def _fresh_outputs(ctx) -> dict:
    """Per available variant, layout and gather dim (its first seed configuration, else its default):
    three calls with fresh inputs, every result kept; then each against its own fp32 reference, and the
    gathered A of ``run_for_backward`` against the concatenated shards."""
    import torch

    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    found = {}
    for name, variant in sorted(op.available_variants(ctx.target).items()):
        if name.startswith("planted"):
            continue
        for gd in (0, 1):
            for layout in ("kn", "nk"):
                key = _key(ctx, 256, gd, layout)
                seeds = [
                    c
                    for c in variant.seed_configs(key, ctx.target)
                    if variant.check(key, ctx.target, c) is None
                ]
                try:
                    params = seeds[0] if seeds else variant.default_params(key, ctx.target)
                except ValueError as exc:  # no valid configuration at this world size
                    found[(name, gd, layout)] = f"skipped: {exc}"
                    continue
                ws = variant.prepare(key, params, ctx)
                results = []
                for seed in (1, 2, 3):
                    inputs = op.make_inputs(key, ctx.rank, ctx.device, seed)
                    results.append((seed, variant.run(ws, inputs, ctx)))
                saved = variant.run_for_backward(ws, op.make_inputs(key, ctx.rank, ctx.device, 4), ctx)
                torch.cuda.synchronize()
                errs = [relative_error(c, op.reference(key, ctx.rank, ctx.device, s)) for s, c in results]
                gathered_err = None
                if saved is not None:
                    shards = [op.make_inputs(key, r, ctx.device, 4)[0].float() for r in range(ctx.world_size)]
                    gathered_err = relative_error(saved[1], torch.cat(shards, dim=gd))
                    errs.append(relative_error(saved[0], op.reference(key, ctx.rank, ctx.device, 4)))
                ptrs = {c.data_ptr() for _, c in results}
                found[(name, gd, layout)] = (max(errs), len(ptrs), gathered_err)
    return found


def _check_fresh(results: list[dict]) -> None:
    ran = set()
    for per_rank in results:
        for case, got in per_rank.items():
            if isinstance(got, str):
                continue
            err, distinct, gathered_err = got
            assert err < 1e-2, (case, got)
            assert distinct == 3, (case, got)  # three live results, three storages
            assert gathered_err is None or gathered_err < 1e-2, (case, got)
            ran.add(case[0])
    assert "bsp" in ran


@pytest.mark.gpu
def test_every_variant_returns_fresh_outputs_on_one_gpu() -> None:
    _check_fresh(run_ranks(_fresh_outputs, 1, "cuda", timeout=600))


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
def test_every_variant_returns_fresh_outputs_on_two_gpus() -> None:
    _check_fresh(run_ranks(_fresh_outputs, 2, "cuda", timeout=600))


@pytest.mark.gpu(world_size=4)
@pytest.mark.slow
def test_every_variant_returns_fresh_outputs_on_four_gpus() -> None:
    _check_fresh(run_ranks(_fresh_outputs, 4, "cuda", timeout=600))


def _table_of(ctx, path: str, variant: str) -> None:
    """A table whose record for every layout of the M=256 shape names ``variant`` (its first seed)."""
    from autotaxer.ops import get_op
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    v = get_op("ag_gemm").variants[variant]
    records = []
    for gd in (0, 1):
        for layout in ("kn", "nk"):
            key = _key(ctx, 256, gd, layout)
            seeds = [c for c in v.seed_configs(key, ctx.target) if v.check(key, ctx.target, c) is None]
            params = seeds[0] if seeds else v.default_params(key, ctx.target)
            records.append(WinnerRecord(key, variant, params, 5.0, 9.0, 1, arch=ctx.target.arch,
                                        num_sms=ctx.target.num_sms))  # fmt: skip
    write_table(records, path)


def _dispatch_grads(ctx, table_dir: str, variant: str) -> dict:
    """Through dispatch (the table serves ``variant``): two outputs of one shape kept alive, gradients
    of a shard and of nn.Linear's weight against plain PyTorch in fp32, the custom op twice."""
    import torch
    import torch.distributed as dist

    import autotaxer

    path = f"{table_dir}/{variant}-rank{ctx.rank}.json"
    _table_of(ctx, path, variant)
    rt = autotaxer.init(autotaxer.RuntimeConfig(tables=(path,), env_tables=False, shipped_tables=False,
                                                persist_misses=False))  # fmt: skip
    ws, r, dev = ctx.world_size, ctx.rank, ctx.device
    g = torch.Generator(device=dev).manual_seed(5)
    out = {}
    for gd in (0, 1):
        a_full = torch.randn(256, K, device=dev, generator=g).bfloat16()
        a2_full = torch.randn(256, K, device=dev, generator=g).bfloat16()
        w = (torch.randn(N, K, device=dev, generator=g) / K**0.5).bfloat16()
        dist.broadcast(a_full, 0) if ws > 1 else None
        dist.broadcast(a2_full, 0) if ws > 1 else None
        dist.broadcast(w, 0) if ws > 1 else None
        shard = a_full.chunk(ws, gd)[r].contiguous().requires_grad_()
        weight = w.clone().requires_grad_()
        c1 = autotaxer.dispatch("ag_gemm", shard, weight.t(), gather_dim=gd)
        c2 = autotaxer.dispatch("ag_gemm", a2_full.chunk(ws, gd)[r].contiguous(), weight.t().detach(),
                                gather_dim=gd)  # fmt: skip
        grad = torch.randn(c1.shape, device=dev, generator=g)
        (c1.float() * grad).sum().backward()
        ref_a, ref_w = a_full.float().requires_grad_(), w.float().requires_grad_()
        (torch.nn.functional.linear(ref_a, ref_w) * grad).sum().backward()

        def rel(x, y):
            return ((x.float() - y).norm() / y.norm()).item()

        op1 = torch.ops.autotaxer.ag_gemm(shard.detach(), weight.detach().t(), gd, "")
        op2 = torch.ops.autotaxer.ag_gemm(a2_full.chunk(ws, gd)[r].contiguous(), weight.detach().t(), gd, "")
        out[gd] = {
            "c1": rel(c1, a_full.float() @ w.float().t()),
            "c2": rel(c2, a2_full.float() @ w.float().t()),
            "op1": rel(op1, a_full.float() @ w.float().t()),
            "op2": rel(op2, a2_full.float() @ w.float().t()),
            "grad_a": rel(shard.grad, ws * ref_a.grad.chunk(ws, gd)[r]),
            "grad_w": rel(weight.grad, ref_w.grad),
            "variants": sorted({d.variant for k, d in rt.decisions().items() if k.op == "ag_gemm"}),
        }
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["bsp", "push", "pull", "push_tma"])
def test_dispatch_gradients_on_one_gpu(tmp_path, variant: str) -> None:
    from autotaxer._target import cuda_target

    if variant != "bsp":
        from autotaxer.ops import get_op

        reason = get_op("ag_gemm").variants[variant].unavailable_reason(cuda_target(0))
        if reason:
            pytest.skip(reason)
    _check_grads(run_ranks(_dispatch_grads, 1, "cuda", args=(str(tmp_path), variant), timeout=600), variant)


def _check_grads(results: list[dict], variant: str) -> None:
    for per_rank in results:
        for gd, got in per_rank.items():
            for name in ("c1", "c2", "op1", "op2", "grad_a", "grad_w"):
                assert got[name] < 1e-2, (variant, gd, name, got)
            assert got["variants"] == [variant], got


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bsp", "push", "pull", "push_tma", "copy_engine"])
def test_dispatch_gradients_on_two_gpus(tmp_path, variant: str) -> None:
    _check_grads(run_ranks(_dispatch_grads, 2, "cuda", args=(str(tmp_path), variant), timeout=600), variant)
