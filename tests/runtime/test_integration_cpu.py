"""What a tensor-parallel model needs of dispatch, on gloo ranks (CPU, fp32): fresh outputs kept alive,
nn.Linear's transposed weight, gradients against plain PyTorch, ``torch.compile`` with autograd,
``fused_all_gather_matmul`` with PyTorch's signature and ``ColumnParallelLinear``."""

from __future__ import annotations

import pytest
from _factories import at_world_size, by_check

from autotaxer.testing import run_ranks


def _runtime(tables: tuple[str, ...] = ()):
    import autotaxer

    return autotaxer.init(
        autotaxer.RuntimeConfig(tables=tables, env_tables=False, shipped_tables=False, persist_misses=False)
    )


def _rand(seed: int, *shape: int):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def _shard(full, rank: int, ws: int, dim: int):
    return full.chunk(ws, dim=dim)[rank].contiguous()


def _weight(rank: int, n: int, k: int, layout: str):
    """Rank ``rank``'s B ``(K, N)``: row-major (``kn``) or an nn.Linear weight's transpose (``nk``)."""
    if layout == "nk":
        return _rand(100 + rank, n, k).t()
    return _rand(100 + rank, k, n)


def _grads_against_pytorch(ctx, gd: int, layout: str, compiled: bool) -> dict:
    """Every rank multiplies the gathered A by its own B; ``loss = sum_r <C_r, G_r>``. The gradients of
    A's shard and of B on each rank against autograd of the same loss written in plain PyTorch."""
    import torch

    import autotaxer

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    m, n, k = 4 * ws, 6, 4 * ws
    a_full = _rand(1, m, k)
    a_shard = _shard(a_full, r, ws, gd).requires_grad_()
    b = _weight(r, n, k, layout).detach().requires_grad_()
    g = _rand(200 + r, m, n)

    def f(x, y):
        return autotaxer.dispatch("ag_gemm", x, y, gather_dim=gd)

    fn = torch.compile(f, backend="aot_eager", fullgraph=True) if compiled else f
    c = fn(a_shard, b)
    (c * g).sum().backward()

    ref_a = a_full.clone().requires_grad_()
    ref_bs = [_weight(q, n, k, layout).detach().requires_grad_() for q in range(ws)]
    sum((ref_a @ ref_bs[q] * _rand(200 + q, m, n)).sum() for q in range(ws)).backward()
    return {
        "c": (c - a_full @ b.detach()).abs().max().item(),
        "grad_a": (a_shard.grad - _shard(ref_a.grad, r, ws, gd)).abs().max().item(),
        "grad_b": (b.grad - ref_bs[r].grad).abs().max().item(),
        "grad_fn": type(c.grad_fn).__name__,
    }


GRAD_CASES = [(gd, layout) for gd in (0, 1) for layout in ("kn", "nk")]


def _two_rank_checks(ctx, table: str) -> dict:
    """This module's checks at 2 ranks, one after another in one spawned group (spawning one costs
    seconds); each sets up its own runtime first."""
    return {
        "grads": _all_grad_cases(ctx, GRAD_CASES, False),
        "grads_compiled": _all_grad_cases(ctx, [(0, "nk"), (1, "kn")], True),
        "fresh": _fresh_outputs(ctx, table),
        "symm_mem": _symm_mem_signature(ctx),
        "symm_mem_compiled": _compiled_symm_mem(ctx),
        "column_parallel": _column_parallel(ctx),
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[str, list]:
    """``{check: results in rank order}`` of :func:`_two_rank_checks`."""
    table = tmp_path_factory.mktemp("tables") / "t.json"
    _write_fresh_table(table, 2)
    return by_check(run_ranks(_two_rank_checks, 2, "cpu", args=(str(table),), timeout=600))


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4], ids=lambda w: f"ws{w}")
def test_gradients_match_plain_pytorch(world_size: int, request) -> None:
    for per_rank in at_world_size(request, world_size, "grads", _all_grad_cases, (GRAD_CASES, False)):
        for case, got in per_rank.items():
            assert got["grad_fn"] != "NoneType", case
            for name in ("c", "grad_a", "grad_b"):
                assert got[name] < 1e-4, (case, name, got)


def _all_grad_cases(ctx, cases: list, compiled: bool) -> dict:
    return {case: _grads_against_pytorch(ctx, *case, compiled) for case in cases}


@pytest.mark.slow
def test_gradients_under_torch_compile_match_plain_pytorch(two_ranks) -> None:
    """The custom op ``autotaxer::ag_gemm_saving`` and its autograd registration (aot_eager traces the
    backward too)."""
    for per_rank in two_ranks["grads_compiled"]:
        for case, got in per_rank.items():
            for name in ("c", "grad_a", "grad_b"):
                assert got[name] < 1e-4, (case, name, got)


def _fresh_outputs(ctx, table: str) -> dict:
    """Two calls of one shape with both results kept (and a third of the other layout): the first is
    unchanged and correct after the others ran; every variant that runs on CPU, through dispatch."""
    import torch

    import autotaxer

    rt = _runtime((table,))
    ws, r = ctx.world_size, ctx.rank
    out = {}
    for m in (8 * ws, 40 * ws):  # tuned: cpu_chunked; far from it (no nearest record): bsp
        for gd in (0, 1):
            for layout in ("kn", "nk"):
                n, k = 12, 8 * ws
                a1, a2 = _rand(m + 1, m, k), _rand(m + 2, m, k)
                b = _weight(0, n, k, layout)
                c1 = autotaxer.dispatch("ag_gemm", _shard(a1, r, ws, gd), b, gather_dim=gd)
                c2 = autotaxer.dispatch("ag_gemm", _shard(a2, r, ws, gd), b, gather_dim=gd)
                c3 = autotaxer.dispatch("ag_gemm", _shard(a2, r, ws, gd), b.contiguous(), gather_dim=gd)
                key = [k_ for k_ in rt.decisions() if k_["M"] == m and k_["gather_dim"] == gd]
                variants = {rt.decisions()[k_].variant for k_ in key}
                out[(m, gd, layout)] = (
                    (c1 - a1 @ b).abs().max().item(),
                    (c2 - a2 @ b).abs().max().item(),
                    (c3 - a2 @ b).abs().max().item(),
                    c1.data_ptr() != c2.data_ptr(),
                    sorted(variants),
                )
    layouts = sorted({k_["b_layout"] for k_ in rt.decisions()})
    return {"cases": out, "layouts": layouts, "ok": torch.isfinite(c1).all().item()}


def _write_fresh_table(path, ws: int) -> None:
    """cpu_chunked records of the shapes :func:`_fresh_outputs` tunes (M = 8 ws), both layouts."""
    from autotaxer import ProblemKey
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    records = []
    for gd in (0, 1):
        for layout in ("kn", "nk"):
            key = ProblemKey.make(
                "ag_gemm", "cpu", ws, "fp32", {"M": 8 * ws, "N": 12, "K": 8 * ws},
                {"gather_dim": gd, "b_layout": layout},
            )  # fmt: skip
            records.append(
                WinnerRecord(
                    key, "cpu_chunked", {"chunks": 2, "order": "rotated"}, 5.0, 9.0, 4, device_type="cpu"
                )
            )
    write_table(records, path)


@pytest.mark.slow
def test_two_results_of_one_shape_stay_correct(two_ranks) -> None:
    ws = 2
    for per_rank in two_ranks["fresh"]:
        assert per_rank["layouts"] == ["kn", "nk"]
        for case, (e1, e2, e3, distinct, variants) in per_rank["cases"].items():
            assert max(e1, e2, e3) < 1e-4 and distinct, case
            assert variants == (["cpu_chunked"] if case[0] == 8 * ws else ["bsp"]), case


def _symm_mem_signature(ctx) -> dict:
    """``fused_all_gather_matmul`` on a 3-D shard, two weights, gather dims 0, 1 and the last, with the
    group given by name; values and gradients against all-gather + matmul in plain PyTorch."""
    import torch.distributed as dist

    import autotaxer

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    errs = {}
    for gd in (0, 1, 2, -1):
        full = _rand(7, 2 * ws, 3 * ws, 4 * ws)
        shard = _shard(full, r, ws, gd).requires_grad_()
        k = full.shape[-1]
        bs = [_weight(q, 5 + q, k, "nk" if q else "kn").detach().requires_grad_() for q in range(2)]
        a, outs = autotaxer.fused_all_gather_matmul(shard, bs, gd, dist.group.WORLD.group_name)
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(outs)) + (a * a).sum()
        loss.backward()
        ref = full.clone().requires_grad_()
        ref_bs = [b.detach().clone().requires_grad_() for b in bs]
        # every rank's loss has the same terms (same Bs here): the shard's gradient is ws times one rank's
        ref_loss = sum(((ref @ b_) * (i + 1)).sum() for i, b_ in enumerate(ref_bs)) + (ref * ref).sum()
        ref_loss.backward()
        errs[gd] = max(
            (a - full).abs().max().item(),
            *((o - full @ b_.detach()).abs().max().item() for o, b_ in zip(outs, bs, strict=True)),
            (shard.grad - ws * _shard(ref.grad, r, ws, gd)).abs().max().item(),
            *((b_.grad - rb.grad).abs().max().item() for b_, rb in zip(bs, ref_bs, strict=True)),
        )
        none_a, _ = autotaxer.fused_all_gather_matmul(shard.detach(), bs[:1], gd, return_A=False)
        errs[f"{gd}-return_A"] = none_a is None
    return {
        **errs,
        "shape": tuple(a.shape),
        "full": tuple(full.shape),
        "outs": [tuple(o.shape) for o in outs],
    }


@pytest.mark.slow
def test_fused_all_gather_matmul_has_pytorchs_contract(two_ranks) -> None:
    for per_rank in two_ranks["symm_mem"]:
        for gd in (0, 1, 2, -1):
            assert per_rank[gd] < 1e-4, (gd, per_rank)
            assert per_rank[f"{gd}-return_A"] is True
        assert per_rank["shape"] == per_rank["full"]


def _compiled_symm_mem(ctx) -> dict:
    """``fused_all_gather_matmul`` inside ``torch.compile`` (aot_eager, one graph): values and grads."""
    import torch

    import autotaxer

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    full = _rand(7, 4 * ws, 8)
    shard = _shard(full, r, ws, 0).requires_grad_()
    bs = [_weight(q, 6, 8, "nk").detach().requires_grad_() for q in range(2)]

    def f(x, b0, b1):
        a, outs = autotaxer.fused_all_gather_matmul(x, [b0, b1], 0)
        return a, outs[0] + 2 * outs[1]

    a, y = torch.compile(f, backend="aot_eager", fullgraph=True)(shard, *bs)
    y.sum().backward()
    ref = full.clone().requires_grad_()
    ref_bs = [b.detach().clone().requires_grad_() for b in bs]
    (ref @ ref_bs[0] + 2 * (ref @ ref_bs[1])).sum().backward()
    return {
        "a": (a - full).abs().max().item(),
        "y": (y - (full @ bs[0] + 2 * (full @ bs[1])).detach()).abs().max().item(),
        "grad_x": (shard.grad - ws * _shard(ref.grad, r, ws, 0)).abs().max().item(),
        "grad_b": max((b.grad - rb.grad).abs().max().item() for b, rb in zip(bs, ref_bs, strict=True)),
    }


@pytest.mark.slow
def test_fused_all_gather_matmul_under_torch_compile(two_ranks) -> None:
    for per_rank in two_ranks["symm_mem_compiled"]:
        assert max(per_rank.values()) < 1e-4, per_rank


def _column_parallel(ctx) -> dict:
    """``ColumnParallelLinear.from_linear`` of each rank's shard and one built from sizes: outputs and
    gradients against the unsharded nn.Linear on the full sequence."""
    import torch
    from torch import nn

    import autotaxer.nn

    _runtime()
    ws, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    full = nn.Linear(8, 4 * ws)  # the same on every rank
    shard = nn.Linear(8, 4)
    with torch.no_grad():
        shard.weight.copy_(full.weight.chunk(ws, 0)[r])
        shard.bias.copy_(full.bias.chunk(ws, 0)[r])
    layer = autotaxer.nn.ColumnParallelLinear.from_linear(shard)
    x = _rand(3, 6 * ws, 2, 8)  # (sequence, batch, hidden)
    x_shard = _shard(x, r, ws, 0).requires_grad_()
    y = layer(x_shard)
    (y * y).sum().backward()
    x_ref = x.clone().requires_grad_()
    y_ref = full(x_ref)
    sum((y_ref.chunk(ws, -1)[q] ** 2).sum() for q in range(ws)).backward()
    sized = autotaxer.nn.ColumnParallelLinear(8, 4 * ws, bias=False)
    return {
        "y": (y - y_ref.chunk(ws, -1)[r]).abs().max().item(),
        "shape": tuple(y.shape),
        "grad_x": (x_shard.grad - _shard(x_ref.grad, r, ws, 0)).abs().max().item(),
        "grad_w": (shard.weight.grad - full.weight.grad.chunk(ws, 0)[r]).abs().max().item(),
        "grad_bias": (shard.bias.grad - full.bias.grad.chunk(ws, 0)[r]).abs().max().item(),
        "shares": layer.weight is shard.weight,
        "sized": (tuple(sized.weight.shape), sized.bias, sized(x_shard.detach()).shape),
    }


@pytest.mark.slow
def test_column_parallel_linear_matches_the_unsharded_layer(two_ranks) -> None:
    for per_rank in two_ranks["column_parallel"]:
        for name in ("y", "grad_x", "grad_w", "grad_bias"):
            assert per_rank[name] < 1e-4, (name, per_rank)
        assert per_rank["shape"] == (12, 2, 4) and per_rank["shares"]
        assert per_rank["sized"][:2] == ((4, 8), None) and tuple(per_rank["sized"][2]) == (12, 2, 4)


def test_one_process_dispatch_is_differentiable_and_refuses_out_with_grad() -> None:
    """World size 1 (no process group): grads equal plain matmul's; ``out=`` with grad is refused."""
    import torch

    import autotaxer

    _runtime()
    a = _rand(1, 6, 5).requires_grad_()
    w = _rand(2, 3, 5).requires_grad_()  # nn.Linear layout
    c = autotaxer.dispatch("ag_gemm", a, w.t(), gather_dim=0)
    c.square().sum().backward()
    a2, w2 = a.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.linear(a2, w2).square().sum().backward()
    assert torch.allclose(a.grad, a2.grad, atol=1e-5) and torch.allclose(w.grad, w2.grad, atol=1e-5)
    assert w.grad.is_contiguous()
    # the custom op (what torch.compile calls): two results of one shape, both kept
    x1, x2 = _rand(3, 6, 5), _rand(4, 6, 5)
    c1 = torch.ops.autotaxer.ag_gemm(x1, w.detach().t(), 0, "")
    c2 = torch.ops.autotaxer.ag_gemm(x2, w.detach().t(), 0, "")
    assert torch.allclose(c1, x1 @ w.detach().t(), atol=1e-5) and torch.allclose(
        c2, x2 @ w.detach().t(), atol=1e-5
    )
    with pytest.raises(RuntimeError, match="out="):
        autotaxer.dispatch("ag_gemm", a, w.t(), gather_dim=0, out=torch.empty(6, 3))
    with pytest.raises(ValueError, match="b_layout: decided by the tensors' strides"):
        autotaxer.dispatch("ag_gemm", a, w.t(), gather_dim=0, b_layout="nk")


def test_non_contiguous_inputs_are_served_with_the_right_values() -> None:
    """A column slice of a wider activation, a strided weight view and an nn.Linear weight: the key
    says ``b_layout=nk`` only for the transposed weight; values equal plain matmul."""
    import torch

    import autotaxer

    rt = _runtime()
    wide = _rand(1, 6, 10)
    a = wide[:, 2:7]  # stride (10, 1): not contiguous
    b_strided = _rand(2, 5, 8)[:, ::2]  # stride (8, 2)
    w = _rand(3, 4, 5)
    for b in (b_strided, w.t(), w.t().contiguous()):
        c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        assert torch.allclose(c, a @ b, atol=1e-5)
    assert sorted(k["b_layout"] for k in rt.decisions()) == ["kn", "nk"]
