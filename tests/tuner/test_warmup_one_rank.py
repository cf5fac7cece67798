"""``autotaxer.warmup`` in one process with no process group (world size 1, CPU), its arguments and
``RuntimeConfig``'s tuning fields refused by name, and a database it cannot write named on failure."""

from __future__ import annotations

import math

import pytest

import autotaxer
from autotaxer.tuner.in_group import GroupTuningError, KeyResult


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("AUTOTAXER_DB", f"sqlite:///{tmp_path}/default.sqlite")
    config = autotaxer.RuntimeConfig(
        db_url=f"sqlite:///{tmp_path}/w.sqlite", shipped_tables=False, env_tables=False, persist_misses=False
    )
    yield autotaxer.init(config)
    from autotaxer.runtime.dispatch import shutdown

    shutdown()


def _step():
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 8, generator=gen), torch.randn(8, 8, generator=gen)
    return (lambda: autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)), a @ b


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget_s": -1}, "budget_s: must be a finite number of seconds >= 0"),
        ({"budget_s": math.nan}, "budget_s"),
        ({"key_budget_s": 0}, "key_budget_s: must be a finite number of seconds > 0"),
        ({"trial_timeout_s": math.inf}, "trial_timeout_s"),
        ({"fleet_wait_s": -0.5}, "fleet_wait_s"),
        ({"trials": 0}, "trials: must be an integer >= 1"),
        ({"variants": ("cpu_chunked", "no_such_variant")}, "variants: unknown no_such_variant"),
        ({"timing": "replayed"}, "timing: must be 'eager', 'graph' or None, got 'replayed'"),
        ({"timing": "graph"}, "timing: 'graph' times CUDA-graph replays and needs a CUDA device"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_anything_runs(kwargs, message) -> None:
    ran = []
    with pytest.raises(ValueError, match=message):
        autotaxer.warmup(lambda: ran.append(1), **kwargs)
    assert ran == []
    with pytest.raises(TypeError, match="step: expected a callable, got str"):
        autotaxer.warmup("not a step")


@pytest.mark.parametrize(
    ("budget_timing", "runtime_timing", "used"),
    [(None, None, "eager"), (None, "graph", "graph"), ("graph", None, "graph"), ("eager", "graph", "eager")],
)
def test_trials_are_timed_as_the_warm_up_asks_else_as_the_runtime_serves(
    budget_timing, runtime_timing, used
) -> None:
    """A warm-up of a step the caller replays in a CUDA graph times its trials as replays (``timing``;
    ``check_graphs`` asks for it), and takes in only winners another process timed that way."""
    from types import SimpleNamespace

    from autotaxer.tuner.in_group import TuningBudget, _Lead

    rt = SimpleNamespace(
        config=SimpleNamespace(tuning_db_url=lambda: "sqlite:///x.sqlite", timing=runtime_timing),
        ctx=SimpleNamespace(target=SimpleNamespace(device_type="cuda")),
    )
    lead = _Lead(rt, TuningBudget(timing=budget_timing), None)
    assert lead.timing.mode == used
    eager, graph = (SimpleNamespace(env={"timing": m}) for m in ("eager", "graph"))
    db = SimpleNamespace(get_winner=lambda key: graph)
    assert (lead._stored(db, None) is graph) is (used == "graph" or lead.timing_mode is None)
    db = SimpleNamespace(get_winner=lambda key: eager)
    assert (lead._stored(db, None) is eager) is (used == "eager")


@pytest.mark.parametrize("field", ["tune_misses", "tune_misses_total_s"])
@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan])
def test_runtime_config_refuses_a_tuning_budget_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be a finite number of seconds > 0"):
        autotaxer.RuntimeConfig(**{field: value}).validate()


def test_one_rank_warms_up_serves_the_winner_and_tunes_nothing_the_second_time(runtime) -> None:
    step, expected = _step()
    report = autotaxer.warmup(step, budget_s=120, trials=2, variants=("cpu_chunked",), progress=False)
    (result,) = report.results
    assert result.key == "ag_gemm|cpu|1|fp32|M=16,N=8,K=8|gather_dim=0" and result.status == "tuned"
    assert result.ran == 2 and result.reached_at in (1, 2) and result.speedup > 0
    assert (step() - expected).abs().max().item() < 1e-4
    (decision,) = runtime.decisions().values()  # the winner, or its fastest form if it did not speed the step
    assert (decision.variant, decision.source) == (report.served(result.key), "exact")
    checked = [c for c in report.checks if c.key == result.key]
    assert checked or result.variant == "bsp"  # a fused winner was checked in the step
    again = autotaxer.warmup(step, budget_s=120, trials=2, variants=("cpu_chunked",), progress=False)
    assert again.results == () and again.seen == 0  # served from its plan: nothing to decide or tune


def test_a_database_it_cannot_write_is_named(runtime, tmp_path) -> None:
    (tmp_path / "a_file").write_text("")
    url = f"sqlite:///{tmp_path}/a_file/w.sqlite"
    step, expected = _step()
    with pytest.raises(GroupTuningError, match=f"^{url}: "):
        autotaxer.warmup(step, db_url=url, budget_s=60, variants=("cpu_chunked",), progress=False)
    assert (step() - expected).abs().max().item() < 1e-4  # the model goes on, served as before


def test_a_key_results_line_names_key_winner_speed_trials_and_seconds() -> None:
    key = "ag_gemm|nvidia-h100-80gb-hbm3|4|bf16|M=256,N=8192,K=8192|gather_dim=0,b_layout=nk"
    fields = dict(trials=12, ran=12, failed=1, seconds=21.04)
    tuned = KeyResult(key, "tuned", "push", {}, 50.0, 65.0, **fields, confirmed=True)
    assert tuned.line(2, 8) == (
        "  [2/8] ag_gemm bf16 M=256 N=8192 K=8192 gd=0 nk: push 1.30× the fastest BSP form "
        "(12 trial(s) run, 1 failed, 21.0 s)"
    )
    unconfirmed = KeyResult(key, "tuned", "push", {}, 50.0, 65.0, **fields)  # e.g. its confirmation failed
    assert unconfirmed.speedup is None and "×" not in unconfirmed.line(2, 8)
    skipped = KeyResult(key, "skipped", note="budget spent")
    assert skipped.line(8, 8).endswith("not tuned (budget spent); served as before")
    assert skipped.speedup is None


def test_keys_whose_tuning_runs_past_its_share_leave_the_deadline_to_the_check(runtime, monkeypatch) -> None:
    """A key's tuning runs past its share (its BSP forms' timing, the confirmation, the trial running when
    the share ran out: 2xH200 layer runs overran 4-5 s a key, and the in-step check held back after the
    tuning found 0 s left). The lead takes the largest overrun seen off the next keys' shares: the keys
    together end within one overrun of the deadline, not one overrun a key. On a clock of the test's."""
    import types

    import torch

    from autotaxer import ProblemKey
    from autotaxer.tuner import in_group
    from autotaxer.tuner.in_group import TuningBudget, tune_in_group

    now = [1000.0]
    clock = types.SimpleNamespace(
        monotonic=lambda: now[0], time=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    monkeypatch.setattr(in_group, "time", clock)
    shares: list[float] = []

    def overrunning(self, db, executor, key, share):
        shares.append(share)
        now[0] += share + 4.0  # the share, then 4 s past it
        return None, "planted: no winner"

    monkeypatch.setattr(in_group._Lead, "_tune", overrunning)
    keys = [
        ProblemKey.make("ag_gemm", "cpu", 1, "fp32", {"M": 16 * (i + 1), "N": 8, "K": 8}, {"gather_dim": 0})
        for i in range(4)
    ]
    runtime.load(torch.device("cpu"))
    t0 = now[0]
    results, spent = tune_in_group(runtime, keys, TuningBudget(budget_s=40.0))
    # 40 s for 4 keys: 10 s, 4 s past it; then each key what is left shared, less the 4 s overrun
    assert shares == pytest.approx([10.0, 26 / 3 - 4, 26 / 3 - 4, 26 / 3 - 4]), shares
    assert now[0] - t0 == pytest.approx(40.0)  # the old code: 56 s (shares 10, 8.7, 6.7, 2.7)
    assert [r.status for r in results] == ["skipped"] * 4 and spent
