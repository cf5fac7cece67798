"""BSP on gloo: every rank gets the reference result, in both layouts and for 2 and 3 ranks."""

from __future__ import annotations

import pytest
from _factories import rank_key

from autotaxer.testing import run_world_sizes


def _check_bsp(ctx, m: int, n: int, k: int, gather_dim: int, seed: int) -> float:
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    key = rank_key(ctx, m, n, k, gather_dim)
    variant = op.variants["bsp"]
    ws = variant.prepare(key, {}, ctx)
    out = op.empty_output(key, ctx.device)
    variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, seed), ctx, out=out)
    return relative_error(out, op.reference(key, ctx.rank, ctx.device, seed))


def _both_layouts(ctx) -> dict[int, float]:
    ws = ctx.world_size
    return {gd: _check_bsp(ctx, 6 * ws, 20, 9 * ws, gd, 7) for gd in (0, 1)}


@pytest.fixture(scope="module")
def errors() -> dict[int, list[dict[int, float]]]:
    """``{world size: per rank {gather_dim: error}}`` at 2, 3 and 4 ranks, from one spawned group."""
    return run_world_sizes(_both_layouts, (2, 3, 4))


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("gather_dim", [0, 1])
def test_bsp_matches_reference_on_every_rank(world_size: int, gather_dim: int, errors) -> None:
    errs = [by_layout[gather_dim] for by_layout in errors[world_size]]
    assert len(errs) == world_size
    assert all(e < 1e-5 for e in errs), errs
