"""Wrappers over dispatch called differently by 2 gloo ranks at a first call (issue 48): an argument error on
one rank only (an empty ``Bs``, ``gather_dim=7`` or ``0.5``, ``reduce_op='max'``, a layer's bad input), the
input requiring grad on one rank only while the weight does on both, a 3-D ``A_shard`` gathered along
dim 0 on one rank and dim 1 on the other (the same 2-D problem). Each ends on every rank with the same
``ConsensusError`` naming the rank and the reason, within seconds; and the group still works after."""

from __future__ import annotations

from _factories import attempt as _attempt

from autotaxer.testing import run_ranks


def _scenarios(ctx) -> dict:
    import torch

    import autotaxer
    from autotaxer.functional import fused_all_gather_matmul, fused_matmul_reduce_scatter
    from autotaxer.nn import ColumnParallelLinear, RowParallelLinear

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    torch.manual_seed(ctx.rank)
    r0, r1 = ctx.rank == 0, ctx.rank == 1
    out: dict = {}
    a, b = torch.randn(4, 6), torch.randn(6, 10)
    out["empty_bs"] = _attempt(lambda: fused_all_gather_matmul(a, [] if r0 else [b], 0))
    out["dim7"] = _attempt(
        lambda: fused_all_gather_matmul(torch.randn(4, 7), [torch.randn(7, 3)], 7 if r1 else 0)
    )
    out["dim_half"] = _attempt(
        lambda: fused_all_gather_matmul(torch.randn(2, 3, 5), [torch.randn(5, 3)], 0.5 if r1 else 0)
    )
    out["max"] = _attempt(
        lambda: fused_matmul_reduce_scatter(torch.randn(4, 6), torch.randn(6, 4), "max" if r0 else "sum", 0)
    )
    row = RowParallelLinear(8, 6, group=None)
    out["layer_input"] = _attempt(lambda: row(torch.randn(6 if r1 else 5, 4)))
    # the input requires grad on rank 0 only, the weight on both: backward would reduce-scatter on rank 0 only
    col = ColumnParallelLinear(9, 4)
    x = torch.randn(3, 9, requires_grad=r0)
    out["grad_input"] = _attempt(lambda: col(x).sum().backward())
    # one 2-D problem (8, 8) from two layouts: dim 0 of (2, 4, 8) on rank 0, dim 1 on rank 1
    a3 = torch.randn(2, 4, 8)
    out["layout"] = _attempt(lambda: fused_all_gather_matmul(a3, [torch.randn(8, 5)], 0 if r0 else 1))
    # the group still works: the same calls made alike
    ref_a = torch.cat([torch.full((2, 4, 8), float(r)) for r in range(ctx.world_size)], 1)
    full, (c,) = fused_all_gather_matmul(torch.full((2, 4, 8), float(ctx.rank)), [torch.ones(8, 5)], 1)
    out["after"] = float((full - ref_a).abs().max() + (c - ref_a @ torch.ones(8, 5)).abs().max())
    autotaxer.runtime.dispatch.shutdown()
    return out


def test_a_first_call_made_differently_by_one_rank_raises_on_every_rank() -> None:
    results = run_ranks(_scenarios, 2, "cpu", timeout=90)
    for rank, r in enumerate(results):
        assert "ConsensusError" in r["empty_bs"], r["empty_bs"]
        assert "rank 0: ValueError: fused_all_gather_matmul: Bs: at least one B is needed" in r["empty_bs"]
        assert "rank 1: ValueError: fused_all_gather_matmul: gather_dim: 7 is not a dimension" in r["dim7"]
        assert "rank 1: ValueError: fused_all_gather_matmul: gather_dim: expected an int" in r["dim_half"]
        assert "rank 0: ValueError: fused_matmul_reduce_scatter: reduce_op" in r["max"], r["max"]
        assert "rank 0: ValueError: RowParallelLinear: x: last dimension 4" not in r["layer_input"]
        assert "rank 0: ValueError: RowParallelLinear: x: dimension 0 (5)" in r["layer_input"], r[
            "layer_input"
        ]
        assert "ConsensusError" in r["grad_input"] and "require grad" in r["grad_input"], r["grad_input"]
        assert (
            "rank 0: tensor arguments 1, 2" in r["grad_input"]
            and "rank 1: tensor arguments 2" in r["grad_input"]
        )
        assert "ConsensusError" in r["layout"] and "different arguments" in r["layout"], r["layout"]
        assert "gather_dim=0" in r["layout"] and "gather_dim=1" in r["layout"], r["layout"]
        assert r["after"] < 1e-4, (rank, r["after"])
