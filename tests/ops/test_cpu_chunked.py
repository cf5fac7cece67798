"""cpu_chunked (gloo, overlapped all-gather + GEMM) matches the reference; invalid chunk counts are pruned."""

from __future__ import annotations

import pytest

from autotaxer._problem import ProblemKey
from autotaxer._target import cpu_target
from autotaxer.ops import get_op, iter_grid
from autotaxer.testing import run_world_sizes


def _errors(ctx, m: int, n: int, k: int, gather_dim: int) -> list[tuple[dict, float]]:
    from autotaxer.measure import check_variant

    op = get_op("ag_gemm")
    variant = op.variants["cpu_chunked"]
    key = ProblemKey.make(
        "ag_gemm", "cpu", ctx.world_size, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": gather_dim}
    )
    out = []
    for params in iter_grid(variant.search_space(key, ctx.target)):
        if variant.check(key, ctx.target, params) is None:
            out.append((params, check_variant(op, variant, key, params, ctx, seed=5)))
    return out


def _both_layouts(ctx) -> dict[int, list[tuple[dict, float]]]:
    m = 8 * ctx.world_size
    return {gd: _errors(ctx, m, 10, 3 * ctx.world_size, gd) for gd in (0, 1)}


@pytest.fixture(scope="module")
def errors() -> dict[int, list]:
    """``{world size: per rank {gather_dim: [(params, error)]}}`` at 2, 3 and 4 ranks, one spawned group."""
    return run_world_sizes(_both_layouts, (2, 3, 4))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_valid_configuration_matches_reference(world_size: int, errors) -> None:
    per_rank = errors[world_size]
    assert len(per_rank) == world_size
    for by_layout in per_rank:
        for results in by_layout.values():
            assert len(results) == 8  # chunks 1, 2, 4, 8 (the shard has 8 or 8*ws rows) x 2 orders
            assert all(err < 1e-5 for _, err in results), results


def test_check_rejects_chunks_that_do_not_divide_the_shard() -> None:
    variant = get_op("ag_gemm").variants["cpu_chunked"]
    key = ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": 12, "N": 4, "K": 4}, {"gather_dim": 0})
    target = cpu_target()
    assert variant.check(key, target, {"chunks": 2, "order": "rotated"}) is None  # 6 rows per shard
    reason = variant.check(key, target, {"chunks": 4, "order": "rotated"})
    assert reason is not None and reason.startswith("chunks:")
    assert variant.check(key, target, {"chunks": 3, "order": "rotated"}).startswith("chunks:")
    assert variant.check(key, target, {"chunks": 2, "order": "sideways"}).startswith("order:")


def test_cpu_only() -> None:
    from autotaxer._problem import Target

    variant = get_op("ag_gemm").variants["cpu_chunked"]
    assert variant.unavailable_reason(cpu_target()) is None
    assert variant.unavailable_reason(Target("nvidia-h200", "sm_90", 132)) is not None
