"""``gemm_rs`` (GEMM + reduce-scatter) on gloo ranks: the op's reference, dispatch in both scatter dims
and weight layouts with results kept alive, gradients against plain PyTorch (its backward is a tuned
``ag_gemm``; ``ag_gemm``'s backward a tuned ``gemm_rs``), PyTorch's ``fused_matmul_reduce_scatter``
signature, ``RowParallelLinear`` with ``ColumnParallelLinear`` as an MLP, and the tuner on a gemm_rs
shape. Test ids name the op and the world size."""

from __future__ import annotations

import pytest
from _factories import at_world_size, by_check

from autotaxer.testing import run_ranks


def _runtime():
    import autotaxer

    return autotaxer.init(
        autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False)
    )


def _rand(seed: int, *shape: int):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def _weight(seed: int, k: int, n: int, layout: str):
    return _rand(seed, n, k).t() if layout == "nk" else _rand(seed, k, n)


def _dispatch_and_grads(ctx, compiled: bool = False) -> dict:
    """Per scatter dim and layout: rank r holds A_r (M, K/ws) and B_r (K/ws, N); two calls kept alive;
    ``loss = sum_r <C_r, G_r>`` differentiated against the same loss in plain PyTorch."""
    import torch

    import autotaxer
    from autotaxer.ops import get_op, relative_error

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    op = get_op("gemm_rs")
    out = {}
    for sd in (0, 1):
        for layout in ("kn", "nk"):
            from autotaxer import ProblemKey

            key = ProblemKey.make("gemm_rs", "cpu", ws, "fp32", {"M": 4 * ws, "N": 6 * ws, "K": 3 * ws},
                                  {"scatter_dim": sd, "b_layout": layout})  # fmt: skip
            a1, b1 = op.make_inputs(key, r, ctx.device, 1)
            a2, b2 = op.make_inputs(key, r, ctx.device, 2)
            assert (b1.stride(0) == 1) == (layout == "nk")
            c1 = autotaxer.dispatch("gemm_rs", a1, b1, scatter_dim=sd)
            c2 = autotaxer.dispatch("gemm_rs", a2, b2, scatter_dim=sd)
            errs = [relative_error(c1, op.reference(key, r, ctx.device, 1)),
                    relative_error(c2, op.reference(key, r, ctx.device, 2))]  # fmt: skip
            # gradients: C_r's loss weights G_r; the reference sums every rank's loss
            m, n, k = 4 * ws, 6 * ws, 3 * ws
            a_full, bs = _rand(10, m, k), [_weight(20 + q, k // ws, n, layout) for q in range(ws)]
            a = a_full.chunk(ws, 1)[r].contiguous().requires_grad_()
            b = bs[r].detach().requires_grad_()
            gs = [_rand(30 + q, *((m // ws, n) if sd == 0 else (m, n // ws))) for q in range(ws)]

            def f(x, y, sd=sd):
                return autotaxer.dispatch("gemm_rs", x, y, scatter_dim=sd)

            c = (torch.compile(f, backend="aot_eager", fullgraph=True) if compiled else f)(a, b)
            (c * gs[r]).sum().backward()
            ref_a = a_full.clone().requires_grad_()
            ref_bs = [x.detach().clone().requires_grad_() for x in bs]
            total = sum(ref_a.chunk(ws, 1)[q] @ ref_bs[q] for q in range(ws))
            sum((total.chunk(ws, sd)[q] * gs[q]).sum() for q in range(ws)).backward()
            out[(sd, layout)] = {
                "values": max(errs),
                "alive": c1.data_ptr() != c2.data_ptr(),
                "c": (c - total.chunk(ws, sd)[r]).abs().max().item(),
                "grad_a": (a.grad - ref_a.grad.chunk(ws, 1)[r]).abs().max().item(),
                "grad_b": (b.grad - ref_bs[r].grad).abs().max().item(),
            }
    return out


def _two_rank_checks(ctx) -> dict:
    """This module's checks at 2 ranks, one after another in one spawned group (spawning one costs
    seconds); each sets up its own runtime first."""
    return {
        "dispatch": _dispatch_and_grads(ctx),
        "compiled": _dispatch_and_grads(ctx, True),
        "symm_mem": _symm_mem_signature(ctx),
        "mlp": _mlp(ctx),
    }


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list]:
    """``{check: results in rank order}`` of :func:`_two_rank_checks`."""
    return by_check(run_ranks(_two_rank_checks, 2, "cpu", timeout=600))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4], ids=lambda w: f"gemm_rs-ws{w}")
def test_dispatch_values_and_gradients_match_plain_pytorch(world_size: int, request) -> None:
    for per_rank in at_world_size(request, world_size, "dispatch", _dispatch_and_grads):
        for case, got in per_rank.items():
            assert got["values"] < 1e-5 and got["alive"], (case, got)
            for name in ("c", "grad_a", "grad_b"):
                assert got[name] < 1e-4, (case, name, got)


@pytest.mark.slow
def test_gradients_under_torch_compile_match_plain_pytorch(two_ranks) -> None:
    """The custom op ``autotaxer::gemm_rs`` and its autograd registration (aot_eager traces backward)."""
    for per_rank in two_ranks["compiled"]:
        for case, got in per_rank.items():
            for name in ("c", "grad_a", "grad_b"):
                assert got[name] < 1e-4, (case, name, got)


def _symm_mem_signature(ctx) -> dict:
    """``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)`` on a 3-D A: every
    scatter dim of the product, sum and avg, values and gradients."""
    import torch.distributed as dist

    import autotaxer

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    errs = {}
    for sd in (0, 1, 2, -1):
        for reduce_op in ("sum", "avg"):
            a_full = _rand(5, 2 * ws, 3 * ws, 4 * ws)
            k_r = a_full.shape[-1] // ws
            bs = [_weight(40 + q, k_r, 5 * ws, "nk") for q in range(ws)]
            a = a_full.chunk(ws, -1)[r].contiguous().requires_grad_()
            b = bs[r].detach().requires_grad_()
            y = autotaxer.fused_matmul_reduce_scatter(a, b, reduce_op, sd, dist.group.WORLD.group_name)
            total = sum(a_full.chunk(ws, -1)[q] @ bs[q] for q in range(ws))
            if reduce_op == "avg":
                total = total / ws
            want = total.chunk(ws, sd % 3)[r]
            y.sum().backward()
            errs[(sd, reduce_op)] = (tuple(y.shape) == tuple(want.shape), (y - want).abs().max().item())
            errs[(sd, reduce_op, "grad")] = a.grad.abs().sum().item() > 0 and b.grad.abs().sum().item() > 0
    return errs


@pytest.mark.slow
def test_fused_matmul_reduce_scatter_has_pytorchs_contract(two_ranks) -> None:
    for per_rank in two_ranks["symm_mem"]:
        for case, got in per_rank.items():
            if len(case) == 3:
                assert got, case
            else:
                assert got[0] and got[1] < 1e-4, (case, got)


def _mlp(ctx) -> dict:
    """A sequence-parallel MLP: ColumnParallelLinear (up) then RowParallelLinear (down), both built from
    each rank's nn.Linear shards, against the unsharded MLP: output and every gradient."""
    import torch
    from torch import nn

    import autotaxer.nn

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    up, down = nn.Linear(8, 4 * ws), nn.Linear(4 * ws, 8)
    up_r, down_r = nn.Linear(8, 4), nn.Linear(4, 8)
    with torch.no_grad():
        up_r.weight.copy_(up.weight.chunk(ws, 0)[r])
        up_r.bias.copy_(up.bias.chunk(ws, 0)[r])
        down_r.weight.copy_(down.weight.chunk(ws, 1)[r])
        down_r.bias.copy_(down.bias)
    col = autotaxer.nn.ColumnParallelLinear.from_linear(up_r)
    row = autotaxer.nn.RowParallelLinear.from_linear(down_r)
    x = _rand(3, 6 * ws, 2, 8)
    x_r = x.chunk(ws, 0)[r].contiguous().requires_grad_()
    y = row(torch.relu(col(x_r)))
    (y * y).sum().backward()
    x_ref = x.clone().requires_grad_()
    y_ref = down(torch.relu(up(x_ref)))
    (y_ref * y_ref).sum().backward()
    return {
        "y": (y - y_ref.chunk(ws, 0)[r]).abs().max().item(),
        "shape": tuple(y.shape),
        "grad_x": (x_r.grad - x_ref.grad.chunk(ws, 0)[r]).abs().max().item(),
        "grad_up": (up_r.weight.grad - up.weight.grad.chunk(ws, 0)[r]).abs().max().item(),
        "grad_down": (down_r.weight.grad - down.weight.grad.chunk(ws, 1)[r]).abs().max().item(),
        # the bias is added to every rank's slice: each rank's gradient is its slice's part
        "grad_down_bias": down_r.bias.grad.tolist(),
        "grad_down_bias_full": down.bias.grad.tolist(),
    }


@pytest.mark.slow
def test_row_parallel_after_column_parallel_matches_the_unsharded_mlp(two_ranks) -> None:
    results = two_ranks["mlp"]
    for per_rank in results:
        for name in ("y", "grad_x", "grad_up", "grad_down"):
            assert per_rank[name] < 1e-4, (name, per_rank)
        assert per_rank["shape"] == (6, 2, 8)
    # the replicated bias's gradient summed over the ranks (as sequence parallelism all-reduces it)
    import torch

    summed = torch.tensor([r["grad_down_bias"] for r in results]).sum(0)
    assert torch.allclose(summed, torch.tensor(results[0]["grad_down_bias_full"]), atol=1e-4)


def test_one_process_gemm_rs_is_differentiable() -> None:
    import torch

    import autotaxer

    _runtime()
    a = _rand(1, 6, 5).requires_grad_()
    w = _rand(2, 3, 5).requires_grad_()
    c = autotaxer.dispatch("gemm_rs", a, w.t(), scatter_dim=0)
    c.square().sum().backward()
    a2, w2 = a.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.linear(a2, w2).square().sum().backward()
    assert torch.allclose(c, a.detach() @ w.detach().t(), atol=1e-5)
    assert torch.allclose(a.grad, a2.grad, atol=1e-5) and torch.allclose(w.grad, w2.grad, atol=1e-5)


@pytest.mark.slow
def test_a_gemm_rs_shape_is_tuned_and_stored(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from autotaxer.storage import open_database

    shapes = tmp_path / "s.csv"
    shapes.write_text(
        "op,M,N,K,dtype,scatter_dim,b_layout\ngemm_rs,16,8,16,fp32,0,nk\ngemm_rs,8,16,8,fp32,1,kn\n"
    )
    url = f"sqlite:///{tmp_path}/t.sqlite"
    cmd = [str(Path(sys.executable).with_name("autotaxer")), "tune", "--device", "cpu", "--world-size", "2"]
    proc = subprocess.run([*cmd, "--shapes", str(shapes), "--db", url, "--trials", "2", "--quiet"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with open_database(url, read_only=True) as db:
        winners = db.winners(op="gemm_rs")
    assert sorted(w.key.text for w in winners) == [
        "gemm_rs|cpu|2|fp32|M=16,N=8,K=16|scatter_dim=0,b_layout=nk",
        "gemm_rs|cpu|2|fp32|M=8,N=16,K=8|scatter_dim=1",
    ]
    assert all(w.variant == "bsp" for w in winners)


def test_blocking_reduce_scatter_waits_for_the_collective(monkeypatch) -> None:
    """``reduce_scatter`` (the bsp variant's, the benchmark's) makes the stream wait for NCCL's work: a
    caller that reads ``out`` or refills ``full`` next must not race the collective (it did on 2 GPUs)."""
    from autotaxer.ops import _collectives

    waited: list[bool] = []

    class Work:
        def wait(self) -> None:
            waited.append(True)

    monkeypatch.setattr(_collectives, "reduce_scatter_async", lambda full, out, sd, group=None: (out, Work()))
    assert _collectives.reduce_scatter("full", "out", 0) == "out"
    assert waited == [True]
