"""``autotaxer.warmup`` and ``RuntimeConfig(tune_misses=...)`` on gloo ranks (CPU, fp32), 2 and 4 ranks.

One spawn per world size runs the scenarios in order on a real SQLite database and returns what each
rank saw; the tests assert on it. At 2 ranks: a layer's forward and backward warmed up (both ops, both
layouts: keys recorded, tuned, persisted, served, ranks agreeing), a second launch on the same database
(tunes nothing), a miss tuned inline at its first call, a search started from the nearest record, the
budget, and planted failing candidates (skipped; the model goes on). At 4 ranks: the first two, then two
groups of two ranks meeting the same key (one tunes it, the other waits and serves its winner).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from autotaxer.testing import run_ranks

#: What ``RuntimeConfig`` the scenarios use besides ``db_url``.
QUIET = {"shipped_tables": False, "env_tables": False, "persist_misses": False}
VARIANTS = ("cpu_chunked",)


def _layer(ws: int, group=None):
    """A column- and a row-parallel layer (a tensor-parallel MLP) and a step that trains it once."""
    import torch
    from torch import nn

    import autotaxer.nn

    torch.manual_seed(0)
    up = autotaxer.nn.ColumnParallelLinear.from_linear(nn.Linear(8, 8, bias=False), group)
    down = autotaxer.nn.RowParallelLinear.from_linear(nn.Linear(8, 8, bias=False), group)
    x = torch.randn(16 // _size(group, ws), 1, 8, requires_grad=True)

    def step() -> None:
        down(torch.relu(up(x))).sum().backward()

    return up, x, step


def _size(group, ws: int) -> int:
    import torch.distributed as dist

    return ws if group is None else dist.get_world_size(group)


def _served(group=None) -> dict:
    from autotaxer.runtime.dispatch import get_runtime

    return {k.text: [d.variant, d.source, dict(d.params)] for k, d in get_runtime(group).decisions().items()}


def _studies(url: str) -> dict:
    """Rank 0's view of the database: per key, its trials (number, state, params, owner, failure)."""
    import optuna

    from autotaxer.storage import open_database

    with open_database(url) as db:
        storage = db.optuna_storage()
        out = {}
        for summary in optuna.get_all_study_summaries(storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            out[summary.study_name] = [
                {
                    "number": t.number,
                    "state": t.state.name,
                    "params": dict(t.params),
                    "owner": t.user_attrs.get("owner"),
                    "failure": t.user_attrs.get("failure", ""),
                }
                for t in study.get_trials()
            ]
        winners = {w.key.text: [w.variant, dict(w.env)] for w in db.winners()}
    return {"studies": out, "winners": winners}


def _against_bsp(up, x) -> float:
    """The largest difference of the column-parallel layer's output from all-gather + F.linear."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    with torch.no_grad():
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        return (up(x) - F.linear(torch.cat(parts), up.weight)).abs().max().item()


def _two_launches(ws: int, rank: int, url: str, config) -> dict:
    """A layer's step warmed up by a first launch, then by a second one on the same database."""
    import autotaxer

    out: dict = {}
    for launch in ("first", "second"):
        autotaxer.init(config)  # a launch's runtime, as a new process would make it
        up, x, step = _layer(ws)
        report = autotaxer.warmup(step, budget_s=300, trials=3, variants=VARIANTS, progress=rank == 0)
        step()
        out[launch] = {"report": report, "served": _served(), "error": _against_bsp(up, x)}
        out[f"db_{launch}"] = _studies(url) if rank == 0 else None
    return out


def _two_ranks(ctx, tmp: str) -> dict:
    import torch

    import autotaxer
    from autotaxer.storage import open_database

    ws, rank = ctx.world_size, ctx.rank
    url = f"sqlite:///{tmp}/warm.sqlite"
    config = autotaxer.RuntimeConfig(db_url=url, **QUIET)
    out = _two_launches(ws, rank, url, config)  # 1 and 2: the second launch tunes nothing
    # 3. tune_misses: a new key is tuned at its first call, then served its winner
    autotaxer.init(dataclasses.replace(config, tune_misses=60.0))
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 8, generator=gen), torch.randn(8, 8, generator=gen)
    got = autotaxer.dispatch("ag_gemm", a.chunk(ws)[rank].contiguous(), b, gather_dim=0)
    out["inline"] = {"served": _served(), "error": (got - a @ b).abs().max().item()}
    # 4. start close: a record near the next key, planted in the database, is its first non-BSP trial
    near = autotaxer.ProblemKey.make(
        "ag_gemm", "cpu", ws, "fp32", {"M": 128, "N": 8, "K": 8}, {"gather_dim": 0}
    )
    if rank == 0:
        from autotaxer.records import WinnerRecord

        with open_database(url) as db:
            db.upsert_winner(WinnerRecord(near, "cpu_chunked", {"chunks": 2, "order": "rotated"}, 5.0, 9.0, 9,
                                          device_type="cpu"))  # fmt: skip
    torch.distributed.barrier()
    autotaxer.init(config)
    a64 = torch.randn(64 // ws, 8, generator=gen)
    step64 = lambda: autotaxer.dispatch("ag_gemm", a64, b, gather_dim=0)  # noqa: E731
    out["seeded"] = autotaxer.warmup(step64, budget_s=300, trials=2, variants=VARIANTS, progress=False)
    # 5. the budget: none left tunes nothing; a tiny share per key runs at most the trial under way
    a96 = torch.randn(96 // ws, 8, generator=gen)
    step96 = lambda: autotaxer.dispatch("ag_gemm", a96, b, gather_dim=0)  # noqa: E731
    out["no_budget"] = autotaxer.warmup(step96, budget_s=0, variants=VARIANTS, progress=False)
    out["tiny_budget"] = autotaxer.warmup(step96, key_budget_s=1e-3, variants=VARIANTS, progress=False)
    # 6. planted failing candidates: wrong results, a raise on rank 1 only, a peer that never signals
    from autotaxer.ops import get_op
    from autotaxer.testing.planted import PlantedNeverSignal, PlantedRaise, PlantedWrong

    for variant in (PlantedWrong(), PlantedRaise(), PlantedNeverSignal()):
        get_op("ag_gemm").register(variant)
    a1 = torch.randn(16, 8 // ws, generator=gen)
    step1 = lambda: autotaxer.dispatch("ag_gemm", a1, b, gather_dim=1)  # noqa: E731
    planted = ("planted_wrong", "planted_raise", "planted_never_signal")
    report = autotaxer.warmup(
        step1, budget_s=300, trials=4, variants=planted, seed_nearby=False, progress=False
    )
    full = torch.cat([torch.empty_like(a1) for _ in range(ws)], dim=1)
    torch.distributed.all_gather(list(full.chunk(ws, dim=1)), a1)
    got = autotaxer.dispatch("ag_gemm", a1, b, gather_dim=1)
    out["planted"] = {"report": report, "served": _served(), "error": (got - full @ b).abs().max().item()}
    # 7. a key another host is tuning (its claim planted): waited for past the group's collective timeout
    # (rank 0 keeps its followers' broadcasts short), then served as before
    from datetime import timedelta

    group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=2))
    held = autotaxer.ProblemKey.from_text(f"ag_gemm|cpu|{ws}|fp32|M=40,N=8,K=8|gather_dim=0")
    if rank == 0:
        with open_database(url) as db:
            db.claim(held, "another-host:1", lambda c: False)
    torch.distributed.barrier()
    autotaxer.init(config, group)
    a40 = torch.randn(40 // ws, 8, generator=gen)
    step40 = lambda: autotaxer.dispatch("ag_gemm", a40, b, gather_dim=0, group=group)  # noqa: E731
    report = autotaxer.warmup(step40, fleet_wait_s=5, variants=VARIANTS, progress=False)
    step40()
    out["claimed"] = {"report": report, "served": _served(group)}
    out["db_last"] = _studies(url) if rank == 0 else None
    return out


def _four_ranks(ctx, tmp: str) -> dict:
    import torch.distributed as dist

    import autotaxer

    ws, rank = ctx.world_size, ctx.rank
    url = f"sqlite:///{tmp}/warm.sqlite"
    config = autotaxer.RuntimeConfig(db_url=url, **QUIET)
    out = _two_launches(ws, rank, url, config)
    # two groups of two ranks meet the same key (ag_gemm|cpu|2|...): one tunes it, the other waits for it
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    up, x, _ = _layer(ws, mine)
    forward = lambda: up(x.detach())  # noqa: E731
    report = autotaxer.warmup(forward, db_url=url, budget_s=300, trials=3, variants=VARIANTS, progress=False)
    forward()
    out["groups"] = {"report": report, "served": _served(mine), "group": rank // 2}
    dist.barrier()
    out["db_last"] = _studies(url) if rank == 0 else None
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both spawns' per-rank results, once for the module (keyed by world size)."""
    results = {}
    for ws, fn in ((2, _two_ranks), (4, _four_ranks)):
        tmp = tmp_path_factory.mktemp(f"ws{ws}")
        env = {"AUTOTAXER_DB": f"sqlite:///{tmp}/default.sqlite", "XDG_DATA_HOME": str(tmp)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # inherited by the spawned ranks: nothing reaches the user's database
        try:
            results[ws] = (run_ranks(fn, ws, "cpu", args=(str(tmp),), timeout=900), Path(tmp))
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return results


def _layer_keys(ws: int) -> set[str]:
    base = f"|cpu|{ws}|fp32|M=16,N=8,K="
    return {
        f"ag_gemm{base}8|gather_dim=0,b_layout=nk",  # up's forward
        f"gemm_rs{base}{8 * ws}|scatter_dim=0,b_layout=nk",  # down's forward
        f"ag_gemm{base}8|gather_dim=0",  # down's backward (its output's gradient gathered)
        f"gemm_rs{base}{8 * ws}|scatter_dim=0",  # up's backward (its input's gradient reduced)
    }


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 4])
def test_a_layers_keys_are_recorded_tuned_persisted_and_served(runs, ws: int) -> None:
    ranks, _ = runs[ws]
    first = ranks[0]["first"]
    report = first["report"]
    keys = _layer_keys(ws)
    assert report.seen == 4 and {r.key for r in report.results} == keys  # both ops, both layouts
    assert all(r.status == "tuned" and r.ran >= 1 for r in report.results), report.results
    winners = ranks[0]["db_first"]["winners"]
    assert set(winners) == keys and not any(env.get("search") == "partial" for _, env in winners.values())
    for r in report.results:  # what the warm-up serves (the winner, or its fastest form where the winner
        # did not speed the step up) is the database's, and what every rank serves
        assert winners[r.key][0] == report.served(r.key)
        assert first["served"][r.key][:2] == [report.served(r.key), "exact"]
        assert winners[r.key][1].get("in_step") in (None, "kept", "replaced")  # a fused winner: checked
    trials = ranks[0]["db_first"]["studies"]
    launched = {k: [t for t in trials[k] if t["state"] in ("COMPLETE", "FAIL")] for k in keys}
    assert {len(launched[k]) for k in keys if k.startswith("ag_gemm")} == {3}  # trials=3 honoured
    assert first["error"] < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 4])
def test_ranks_agree_on_the_report_and_what_is_served(runs, ws: int) -> None:
    ranks, _ = runs[ws]
    for other in ranks[1:]:
        assert other["first"]["report"].results == ranks[0]["first"]["report"].results
        assert other["first"]["served"] == ranks[0]["first"]["served"]


@pytest.mark.slow
@pytest.mark.parametrize("ws", [2, 4])
def test_a_second_launch_on_the_same_database_tunes_nothing(runs, ws: int) -> None:
    ranks, _ = runs[ws]
    second = ranks[0]["second"]["report"]
    assert second.results == () and second.seen == 4
    if ws == 2:
        assert ranks[0]["db_second"]["studies"] == ranks[0]["db_first"]["studies"]  # not one trial more
        assert all(v[1] == "exact" for v in ranks[0]["second"]["served"].values())


@pytest.mark.slow
def test_a_miss_is_tuned_at_its_first_call_with_tune_misses(runs) -> None:
    ranks, _ = runs[2]
    key = "ag_gemm|cpu|2|fp32|M=32,N=8,K=8|gather_dim=0"
    served = [r["inline"]["served"][key] for r in ranks]
    assert served[0][1] == "exact" and served[0] == served[1]  # tuned, then served the same on both ranks
    assert ranks[0]["db_last"]["winners"][key][0] == served[0][0]
    assert len(ranks[0]["db_last"]["studies"][key]) >= 2  # BSP and at least one other form measured
    assert max(r["inline"]["error"] for r in ranks) < 1e-4


@pytest.mark.slow
def test_a_new_keys_search_starts_from_the_nearest_record(runs) -> None:
    ranks, _ = runs[2]
    key = "ag_gemm|cpu|2|fp32|M=64,N=8,K=8|gather_dim=0"
    (result,) = ranks[0]["seeded"].results
    assert result.key == key and result.note.endswith("nearby configuration(s) first")
    trials = sorted(ranks[0]["db_last"]["studies"][key], key=lambda t: t["number"])
    assert [t["params"] for t in trials[:2]] == [
        {"variant": "bsp"},
        {"variant": "cpu_chunked", "cpu_chunked.chunks": 2, "cpu_chunked.order": "rotated"},  # M=128's
    ]


@pytest.mark.slow
def test_the_budget_is_honoured(runs) -> None:
    ranks, _ = runs[2]
    key = "ag_gemm|cpu|2|fp32|M=96,N=8,K=8|gather_dim=0"
    (none,) = ranks[0]["no_budget"].results
    assert (none.key, none.status, none.note, none.ran) == (key, "skipped", "budget spent", 0)
    (tiny,) = ranks[0]["tiny_budget"].results
    assert tiny.ran <= 1  # the share ran out before, or during, the first trial
    trials = ranks[0]["db_last"]["studies"].get(key, [])
    assert len([t for t in trials if t["state"] in ("COMPLETE", "FAIL", "RUNNING")]) <= 1


@pytest.mark.slow
def test_planted_failing_candidates_are_failed_trials_and_the_model_goes_on(runs) -> None:
    ranks, _ = runs[2]
    key = "ag_gemm|cpu|2|fp32|M=16,N=8,K=8|gather_dim=1"
    (result,) = ranks[0]["planted"]["report"].results
    assert result.status == "tuned" and result.variant == "bsp" and result.failed == 3
    trials = {
        t["params"]["variant"]: t for t in ranks[0]["db_last"]["studies"][key] if t["state"] != "PRUNED"
    }
    assert trials["planted_wrong"]["state"] == "FAIL"
    assert trials["planted_wrong"]["failure"].startswith("validation failed")
    assert trials["planted_raise"]["state"] == "FAIL"
    assert trials["planted_raise"]["failure"].startswith("rank 1: RuntimeError: planted_raise")
    assert trials["planted_never_signal"]["state"] == "FAIL"
    assert "PeerTimeoutError" in trials["planted_never_signal"]["failure"]
    assert all(r["planted"]["served"][key][:2] == ["bsp", "exact"] for r in ranks)
    assert max(r["planted"]["error"] for r in ranks) < 1e-4  # dispatch still serves the right result


@pytest.mark.slow
def test_a_key_another_host_tunes_is_waited_for_then_served_as_before(runs) -> None:
    ranks, _ = runs[2]
    key = "ag_gemm|cpu|2|fp32|M=40,N=8,K=8|gather_dim=0"
    (result,) = ranks[0]["claimed"]["report"].results
    assert (result.key, result.status, result.note) == (key, "skipped", "another-host:1 is tuning it")
    assert result.seconds >= 5  # it waited fleet_wait_s, longer than the group's 2 s collective timeout
    assert key not in ranks[0]["db_last"]["studies"]  # and ran no trial of it
    assert all(r["claimed"]["served"][key][1] != "exact" for r in ranks)


@pytest.mark.slow
def test_two_groups_meeting_one_key_tune_it_once(runs) -> None:
    ranks, _ = runs[4]
    key = "ag_gemm|cpu|2|fp32|M=16,N=8,K=8|gather_dim=0,b_layout=nk"
    by_group = {r["groups"]["group"]: r["groups"] for r in ranks}
    statuses = sorted(g["report"].results[0].status for g in by_group.values())
    assert statuses == ["found", "tuned"], statuses
    owners = {t["owner"] for t in ranks[0]["db_last"]["studies"][key]}
    assert len(owners) == 1  # one process ran every trial of the key
    assert by_group[0]["served"][key] == by_group[1]["served"][key]
    assert by_group[0]["served"][key][1] == "exact"


@pytest.mark.slow
def test_export_makes_a_table_of_what_the_warm_ups_tuned(runs, tmp_path) -> None:
    from typer.testing import CliRunner

    from autotaxer.cli import app
    from autotaxer.table_file import read_table

    ranks, folder = runs[2]
    out = tmp_path / "fleet.json"
    result = CliRunner().invoke(app, ["export", "--db", f"sqlite:///{folder}/warm.sqlite", "--out", str(out)])
    assert result.exit_code == 0, result.output
    exported = {r.key.text: r.variant for r in read_table(out)}
    assert _layer_keys(2) <= set(exported)
    assert exported == {k: v[0] for k, v in ranks[0]["db_last"]["winners"].items()}
