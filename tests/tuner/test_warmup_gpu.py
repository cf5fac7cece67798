"""``autotaxer.warmup`` on GPUs: a tensor-parallel MLP's forward warmed up with the default search space
(the fused variants compile and run as trials in the model's own processes), then served its winners,
which equal the fp32 reference; a second warm-up tunes nothing; with ``timing="graph"`` the winners are
timed as CUDA-graph replays. One GPU (world size 1), and 2 GPUs.

    python3 -P -m pytest -q tests/tuner/test_warmup_gpu.py
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks


def _mlp_warm_up(ctx, tmp: str, timing: str | None = None) -> dict:
    import torch
    from torch import nn

    import autotaxer
    import autotaxer.nn

    ws = ctx.world_size
    config = autotaxer.RuntimeConfig(
        db_url=f"sqlite:///{tmp}/warm.sqlite", shipped_tables=False, env_tables=False, persist_misses=False
    )
    torch.manual_seed(0)
    kw = {"device": ctx.device, "dtype": torch.bfloat16}
    up = autotaxer.nn.ColumnParallelLinear.from_linear(nn.Linear(1024, 1024 // ws, bias=False, **kw))
    down = autotaxer.nn.RowParallelLinear.from_linear(nn.Linear(1024 // ws, 1024, bias=False, **kw))
    x = torch.randn(256 // ws, 1, 1024, **kw)

    def step() -> torch.Tensor:
        with torch.no_grad():
            return down(torch.relu(up(x)))

    autotaxer.init(config)
    report = autotaxer.warmup(step, budget_s=150, trials=8, progress=ctx.rank == 0, timing=timing)
    got = step().float()
    with torch.no_grad():  # the same layers through plain all-gather / reduce-scatter in fp32
        parts = [torch.empty_like(x) for _ in range(ws)]
        torch.distributed.all_gather(parts, x)  # run_ranks made a process group, of one rank too
        h = torch.relu(torch.cat(parts).float() @ up.weight.float().t())
        y = h @ down.weight.float().t()
        torch.distributed.all_reduce(y)
        want = y.chunk(ws)[ctx.rank]
    error = ((got - want).norm() / want.norm()).item()
    from autotaxer.runtime.dispatch import get_runtime

    served = {k.text: (d.variant, d.source) for k, d in get_runtime().decisions().items()}
    from autotaxer._problem import ProblemKey
    from autotaxer.records import timing_of
    from autotaxer.storage import open_database

    db = open_database(config.db_url)
    timed = {r.key: timing_of(db.get_winner(ProblemKey.from_text(r.key)).env) for r in report.results}
    db.close()
    autotaxer.init(config)
    again = autotaxer.warmup(step, budget_s=150, trials=8, progress=False)
    return {"report": report, "again": again, "error": error, "served": served, "timed": timed}


def _check(results: list[dict], timing: str = "eager") -> None:
    report = results[0]["report"]
    assert set(results[0]["timed"].values()) == {timing}, results[0]["timed"]  # how its winners were timed
    assert len(report.results) == 2, report  # ag_gemm (nk) and gemm_rs (nk)
    assert all(r.status == "tuned" and r.ran >= 1 for r in report.results), report.results
    for r in report.results:  # the winner, or its fastest form where the step did not get faster
        assert results[0]["served"][r.key] == (report.served(r.key), "exact")
    assert {c.key for c in report.checks} <= {r.key for r in report.results}
    assert all(res["served"] == results[0]["served"] for res in results)  # every rank serves the same
    assert max(res["error"] for res in results) < 2e-2
    assert results[0]["again"].results == ()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("timing", [None, "graph"])
def test_warm_up_on_one_gpu(tmp_path, timing) -> None:
    _check(run_ranks(_mlp_warm_up, 1, "cuda", args=(str(tmp_path), timing), timeout=600), timing or "eager")


@pytest.mark.gpu(world_size=2)
@pytest.mark.slow
def test_warm_up_on_two_gpus(tmp_path) -> None:
    _check(run_ranks(_mlp_warm_up, 2, "cuda", args=(str(tmp_path),), timeout=600))
