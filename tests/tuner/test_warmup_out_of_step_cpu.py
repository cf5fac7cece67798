"""``autotaxer.warmup`` on 2 gloo ranks whose steps differ (issue 48): one rank dispatching a key the other
never does, a step raising on one rank (before and after a dispatch both make). Each ends within seconds
with an error on every rank, before anything is tuned, naming what each rank was at; and the group still
works for a step made alike."""

from __future__ import annotations

from _factories import attempt as _attempt

from autotaxer.testing import run_ranks


def _scenarios(ctx, url: str) -> dict:
    import torch

    import autotaxer

    autotaxer.init(
        autotaxer.RuntimeConfig(shipped_tables=False, env_tables=False, persist_misses=False, db_url=url)
    )
    r0, r1 = ctx.rank == 0, ctx.rank == 1
    a, b = torch.randn(4, 6), torch.randn(6, 8)
    a2, b2 = torch.randn(3, 5), torch.randn(5, 7)

    def warm(step):
        return _attempt(lambda: autotaxer.warmup(step, budget_s=5, progress=False, variants=("cpu_chunked",)))

    def extra() -> None:  # rank 0 dispatches one key more
        autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        if r0:
            autotaxer.dispatch("ag_gemm", a2, b2, gather_dim=0)

    def raises_first() -> None:  # rank 1 raises before the dispatch rank 0 makes
        if r1:
            raise KeyError("boom on rank 1")
        autotaxer.dispatch("ag_gemm", a2, torch.ones(10, 7), gather_dim=1)

    def raises_after() -> None:  # both dispatch, then rank 0 raises
        autotaxer.dispatch("ag_gemm", a, torch.ones(12, 8), gather_dim=1)
        if r0:
            raise ValueError("boom on rank 0")

    out = {"extra": warm(extra), "raises_first": warm(raises_first), "raises_after": warm(raises_after)}
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)  # the group still works
    ref = torch.cat([t for t in _gathered(a)]) @ b
    out["after"] = float((c - ref).abs().max())
    autotaxer.runtime.dispatch.shutdown()
    return out


def _gathered(a):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(a) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, a)
    return parts


def test_steps_that_differ_between_ranks_raise_on_every_rank_before_tuning(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/w.sqlite"
    results = run_ranks(_scenarios, 2, "cpu", args=(url,), timeout=90)
    for r in results:
        assert "OutOfStepError" in r["extra"] and "ranks are out of step" in r["extra"], r["extra"]
        assert "rank 0: dispatch('ag_gemm') first call of ag_gemm" in r["extra"], r["extra"]
        assert "rank 1: autotaxer.warmup's end of the step (1 key(s) dispatched)" in r["extra"], r["extra"]
        assert "OutOfStepError" in r["raises_first"], r["raises_first"]
        assert "rank 0: dispatch('ag_gemm')" in r["raises_first"], r["raises_first"]
        assert "rank 1: autotaxer.warmup's end of the step (0 key(s)" in r["raises_first"], r["raises_first"]
        assert "ConsensusError: autotaxer.warmup: the step raised on some ranks" in r["raises_after"]
        assert "rank 0: ValueError: boom on rank 0" in r["raises_after"], r["raises_after"]
        assert r["after"] < 1e-4


def test_keys_are_compared_within_each_group_only() -> None:
    from autotaxer.tuner.warmup import _differing_keys

    # two groups of two ranks, each with its own key: they agree
    same = [
        {"g1": ((0, 1), ["k1"])},
        {"g1": ((0, 1), ["k1"])},
        {"g2": ((2, 3), ["k2"])},
        {"g2": ((2, 3), ["k2"])},
    ]
    assert _differing_keys(same) == ""
    # rank 3 saw nothing on its group, rank 2 a key: named
    differ = [{"g1": ((0, 1), ["k1"])}, {"g1": ((0, 1), ["k1"])}, {"g2": ((2, 3), ["k2"])}, {}]
    assert _differing_keys(differ) == "group g2: rank 2 only: k2; rank 3 only: none"
