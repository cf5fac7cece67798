"""Variants' seed configurations: valid, inside the search space, enqueued by the tuner round robin."""

from __future__ import annotations

import pytest

from autotaxer._problem import ProblemKey, Target
from autotaxer.ops import get_op
from autotaxer.tuner.study import SearchSpace, enqueue_seeds, seed_points, split_params

H200 = Target("nvidia-h200", "sm_90", 132)
MI300 = Target("amd-mi300x", "gfx942", 304)


def _key(m: int, gd: int, target: Target = H200, world_size: int = 2) -> ProblemKey:
    return ProblemKey.make(
        "ag_gemm", target.gpu_model, world_size, "bf16", {"M": m, "N": 8192, "K": 8192}, {"gather_dim": gd}
    )


@pytest.mark.parametrize("m,gd", [(16, 0), (16, 1), (256, 0), (512, 1), (4096, 0), (16384, 1)])
def test_seeds_are_valid_points_of_the_space(m: int, gd: int) -> None:
    op = get_op("ag_gemm")
    key = _key(m, gd)
    space = SearchSpace.build(op, key, H200, ("bsp", "push", "pull"))
    points = seed_points(op, space)
    assert [p["variant"] for p in points[:2]] == ["push", "pull"]  # every variant's first seed first
    seeds = op.variants["push"].seed_configs(key, H200)
    assert len(points) == 2 * len(seeds) and len({tuple(sorted(c.items())) for c in seeds}) == len(seeds)
    # up to M=512 every regime tries "every program produces"; from M=512 (more than one wave of tiles)
    # the first seed has dedicated producers, which join the GEMM, over many row chunks
    assert any(c["comm_sms"] == 0 for c in seeds) == (m <= 512)
    assert (seeds[0]["comm_sms"] > 0) == (m >= 512)
    for point in points:
        name, params = split_params(point)
        assert op.variants[name].check(key, H200, params) is None, params
        choices = space.params_of(name)
        assert set(params) == set(choices) and all(params[p] in choices[p] for p in choices)


def test_prefetch_seed_is_nvidia_and_gather_dim_0_only() -> None:
    push = get_op("ag_gemm").variants["push"]
    assert any(c["prefetch_k"] for c in push.seed_configs(_key(16, 0), H200))
    assert not any(c["prefetch_k"] for c in push.seed_configs(_key(16, 1), H200))
    assert not any(c["prefetch_k"] for c in push.seed_configs(_key(16, 0, MI300), MI300))
    params = dict(push.seed_configs(_key(16, 0), H200)[0], prefetch_k=1024)
    assert "prefetch_k" in push.check(_key(16, 1), H200, params)
    assert "prefetch_k" in push.check(_key(16, 0, MI300), MI300, params)


def test_invalid_or_outside_seeds_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    op = get_op("ag_gemm")
    key = _key(4096, 0)
    push = op.variants["push"]
    good = push.seed_configs(key, H200)[0]
    outside = dict(good, block_n=96)  # not a listed choice
    invalid = dict(good, block_m=128, block_n=256, num_warps=4)  # the check refuses it
    monkeypatch.setattr(type(push), "seed_configs", lambda self, k, t: [outside, invalid, good])
    space = SearchSpace.build(op, key, H200, ("bsp", "push"))
    assert [split_params(p)[1] for p in seed_points(op, space)] == [good]


def test_tuner_enqueues_seeds_once() -> None:
    import optuna

    op = get_op("ag_gemm")
    key = _key(256, 0)
    space = SearchSpace.build(op, key, H200, ("bsp", "push", "pull"))
    study = optuna.create_study(direction="minimize")
    n = enqueue_seeds(study, op, space)
    assert n == len(seed_points(op, space)) > 0
    enqueue_seeds(study, op, space)  # a resumed run queues nothing twice
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(waiting) == n


@pytest.mark.parametrize("world_size", [4, 8])
@pytest.mark.parametrize("m,gd", [(64, 0), (256, 1), (1024, 0), (4096, 1)])
def test_many_peer_seeds_follow_the_first_and_stay_in_the_space(world_size: int, m: int, gd: int) -> None:
    """From 3 ranks on the second seed is the first with the many-peer schedule (push: peer order and
    per-peer release; gather_dim=0: groups over the gathered M); with dedicated producers a third doubles
    them. pull gets no push-only field. At 2 ranks nothing changes (those fields have one value there)."""
    op = get_op("ag_gemm")
    key = _key(m, gd, world_size=world_size)
    for name in ("push", "pull", "push_tma"):
        variant = op.variants[name]
        seeds = variant.seed_configs(key, H200)
        first, wide = seeds[0], seeds[1]
        assert wide["group_across"] == int(gd == 0)
        assert (wide["push_order"], wide["release_each"]) == ((0, 0) if name == "pull" else (1, 1))
        assert {k: v for k, v in wide.items() if k not in ("group_across", "push_order", "release_each")} == {
            k: v for k, v in first.items() if k not in ("group_across", "push_order", "release_each")
        }
        if first["comm_sms"]:
            assert seeds[2]["comm_sms"] == min(2 * first["comm_sms"], 32)
        valid = [variant.check(key, H200, c) is None for c in seeds]
        assert valid[1] == valid[0], (name, seeds[:2])  # valid wherever the first seed is
        space = SearchSpace.build(op, key, H200, (name,))
        points = [split_params(p)[1] for p in seed_points(op, space)]
        assert (wide in points) == valid[1]  # queued by the tuner wherever it is valid
    two = op.variants["push"].seed_configs(_key(m, gd), H200)
    assert not any(c["push_order"] or c["release_each"] or c["group_across"] for c in two)


@pytest.mark.parametrize("name", ["push", "pull", "push_tma"])
def test_deep_pipelines_are_searched_and_seeded_where_b_bounds_the_gemm(name: str) -> None:
    """M <= 256: six pipeline stages are a choice and a seed (valid in an H200's shared memory); above,
    neither. 128x256 tiles do not fit six stages, and the check says so."""
    variant = get_op("ag_gemm").variants[name]
    small, large = _key(256, 0), _key(1024, 0)
    assert 6 in variant.search_space(small, H200)["num_stages"]
    assert 6 not in variant.search_space(large, H200)["num_stages"]
    deep = [c for c in variant.seed_configs(small, H200) if c["num_stages"] == 6]
    assert deep and all(variant.check(small, H200, c) is None for c in deep)
    assert not any(c["num_stages"] == 6 for c in variant.seed_configs(large, H200))
    wide = dict(deep[0], block_n=256, num_warps=8)
    assert "num_stages" in variant.check(small, H200, wide)
