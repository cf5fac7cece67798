"""BSP on gloo: every rank gets the reference result, in both layouts and for 2 and 3 ranks."""

from __future__ import annotations

import pytest
from _factories import rank_key

from autotaxer.testing import run_ranks


def _check_bsp(ctx, m: int, n: int, k: int, gather_dim: int, seed: int) -> float:
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    key = rank_key(ctx, m, n, k, gather_dim)
    variant = op.variants["bsp"]
    ws = variant.prepare(key, {}, ctx)
    out = op.empty_output(key, ctx.device)
    variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, seed), ctx, out=out)
    return relative_error(out, op.reference(key, ctx.rank, ctx.device, seed))


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("gather_dim", [0, 1])
def test_bsp_matches_reference_on_every_rank(world_size: int, gather_dim: int) -> None:
    errs = run_ranks(_check_bsp, world_size, "cpu", args=(6 * world_size, 20, 9 * world_size, gather_dim, 7))
    assert len(errs) == world_size
    assert all(e < 1e-5 for e in errs), errs
