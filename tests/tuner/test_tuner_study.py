"""The tuner's study logic, in-process on one CPU rank (no spawning): grid, repeats, resume, retune, stale."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from _factories import FAST, KEY, InlineExecutor

from autotaxer._target import cpu_target
from autotaxer.measure import TimingConfig
from autotaxer.records import confirmed_times, is_confirmed
from autotaxer.tuner import TuneConfig, tune
from autotaxer.tuner.progress import Reporter
from autotaxer.tuner.study import STALE_AFTER_S, StudyError, fail_stale_trials, open_study, split_params
from autotaxer.tuner.worker import RankReply, TrialRequest


@pytest.fixture
def db(tmp_path: Path):
    from autotaxer.storage import open_database

    database = open_database(f"sqlite:///{tmp_path}/t.sqlite")
    yield database
    database.close()


def _run(db, **changes):
    config = TuneConfig(**{"trials": 4, "timing": FAST, **changes})
    executor = InlineExecutor()
    results, summary = tune([KEY], cpu_target(), db, config, executor)
    return results[0], executor


def _trials(db):
    import optuna

    return optuna.load_study(study_name=KEY.text, storage=db.optuna_storage()).get_trials()


def test_grid_runs_every_valid_point_once(db) -> None:
    result, executor = _run(db, sampler="grid")
    points = {(r.variant, tuple(sorted(r.params.items()))) for r in executor.requests}
    assert len(executor.requests) == len(points) == 1 + 8  # bsp + chunks {1,2,4,8} x 2 orders
    assert result.trials == 9 and result.stored
    winner = db.get_winner(KEY)
    assert winner.trials == 9 and is_confirmed(winner.env)  # its times: the confirmation's, not a trial's
    (confirmation,) = executor.confirmations
    best = min((t for t in _trials(db)), key=lambda t: t.value)
    assert confirmation.entries[0] == split_params(best.params)  # the best trial, re-timed beside bsp
    assert winner.variant in {name for name, _ in confirmation.entries}


def test_repeats_are_pruned_and_a_small_space_ends_when_exhausted(db) -> None:
    result, executor = _run(db, sampler="random", trials=50)
    launched = [(r.variant, tuple(sorted(r.params.items()))) for r in executor.requests]
    assert len(launched) == len(set(launched)) == 9
    pruned = [t for t in _trials(db) if t.state.name == "PRUNED"]
    assert all(t.user_attrs["pruned"].startswith("duplicate of trial") for t in pruned)
    assert result.trials == 9


def test_a_sampler_that_keeps_drawing_what_ran_gives_its_draws_to_untried_configurations(
    db, monkeypatch
) -> None:
    """A sampler stuck on one point (TPE late in a small space does this: 1379 pruned asks at one key of the
    2xH200 graph tune): after FILL_AFTER pruned asks in a row the next draw is an untried valid point, so
    the budget buys new configurations; they count as draws, not queued ones (a resume adds none)."""
    import optuna

    import autotaxer.tuner.run as run
    from autotaxer.tuner.study import FILLED, queued_points

    class Stuck(optuna.samplers.BaseSampler):
        def infer_relative_search_space(self, study, trial):
            return {}

        def sample_relative(self, study, trial, search_space):
            return {}

        def sample_independent(self, study, trial, name, distribution):
            return distribution.choices[-1]

    monkeypatch.setattr(run, "make_sampler", lambda *a: Stuck())
    result, executor = _run(db, trials=9, sampled=1)
    launched = [(r.variant, tuple(sorted(r.params.items()))) for r in executor.requests]
    assert len(launched) == len(set(launched)) == 9  # bsp and every cpu_chunked point
    trials = _trials(db)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    filled = [t for t in trials if t.user_attrs.get(FILLED)]
    assert filled and all(t.state.name == "COMPLETE" for t in filled)
    assert len(pruned) <= run.FILL_AFTER * (len(filled) + 1)
    study = optuna.load_study(study_name=KEY.text, storage=db.optuna_storage())
    assert queued_points(study) == sum("fixed_params" in t.system_attrs for t in trials) - len(filled)
    again, executor = _run(db, trials=9, sampled=1)
    assert executor.requests == [] and again.trials == result.trials == 9


def test_an_untried_point_is_listed_in_a_small_space_and_drawn_in_a_large_one(monkeypatch) -> None:
    """``draw_untried``: a space of a few points is listed (none left: the search is over); a large one is
    drawn from (an ``ag_gemm`` Iris variant's ~240k points took 48 s to list); neither returns a launched
    point (out-of-reach variants: ``test_tuner_cpu.py``'s reach test)."""
    import random

    import optuna

    import autotaxer.tuner.study as study_mod
    from autotaxer.ops import get_op
    from autotaxer.tuner.study import SearchSpace, draw_untried, flat_params, suggest

    op = get_op("ag_gemm")
    space = SearchSpace.build(op, KEY, cpu_target(), None)
    study = optuna.create_study()
    everything = space.valid_points(op)
    for listed in (4096, 0):  # listed, then drawn (every space counts as large)
        monkeypatch.setattr(study_mod, "UNTRIED_LISTED", listed)
        point, over = draw_untried(study, op, space, 0.0, random.Random(listed))
        assert point in everything and not over
    for point in everything:  # every valid point launched: nothing left
        study.enqueue_trial(point)
        trial = study.ask()
        suggest(trial, space)
        study.tell(trial, 1.0)
    monkeypatch.setattr(study_mod, "UNTRIED_LISTED", 4096)
    assert draw_untried(study, op, space, 0.0, random.Random(0)) == (None, True)
    monkeypatch.setattr(study_mod, "UNTRIED_LISTED", 0)  # too large to list: not known to be over
    assert draw_untried(study, op, space, 0.0, random.Random(0)) == (None, False)
    assert flat_params("bsp", {}) in everything


def test_a_keys_budget_is_set_without_checking_its_whole_space(db, monkeypatch) -> None:
    """The trials a key gets are capped by its valid points, counted only as far as the budget: the start of
    every ``ag_gemm`` key with the Iris variants counted ~240k points, 6.6 s a key on 2xH200."""
    from autotaxer.tuner.study import SearchSpace

    limits = []
    count_valid = SearchSpace.count_valid

    def spy(self, op, limit=200_000):
        limits.append(limit)
        return count_valid(self, op, limit)

    monkeypatch.setattr(SearchSpace, "count_valid", spy)
    result, _ = _run(db, trials=3, sampled=1)
    assert limits and max(limits) <= 3 + 10  # the budget and one more, not the whole space
    assert result.trials >= 3


def test_a_later_confirmation_replaces_a_luckier_stored_one(db) -> None:
    """The record is the latest side-by-side re-timing, never the best of noisy runs kept across runs."""
    import dataclasses

    _run(db, trials=3)
    lucky = db.get_winner(KEY)
    db.upsert_winner(dataclasses.replace(lucky, median_us=0.1), replace=True)
    _run(db, trials=5)
    record = db.get_winner(KEY)
    assert record.trials == 5 and is_confirmed(record.env)
    assert record.median_us > 0.1


def test_resume_counts_finished_trials_and_retune_starts_over(db) -> None:
    _run(db, trials=3)
    result, executor = _run(db, trials=5)
    assert len(executor.requests) == 2 and result.trials == 5
    result, executor = _run(db, trials=5)
    assert executor.requests == [] and result.trials == 5
    assert db.get_winner(KEY).trials == 5
    result, executor = _run(db, trials=2, retune=True)
    assert len(executor.requests) == 2 and result.trials == 2
    assert len(_trials(db)) == 2 and db.get_winner(KEY).trials == 2
    assert executor.requests[0].variant == "bsp"  # the baseline comes first in a fresh study


def test_warm_start_runs_previous_configurations_right_after_the_baseline(db) -> None:
    best = {"chunks": 8, "order": "rotated"}
    warm = {
        KEY.text: (
            ("cpu_chunked", best),
            ("cpu_chunked", {"chunks": 3, "order": "rotated"}),  # outside the space: skipped
            ("no_such_variant", {}),  # not searched: skipped
            ("cpu_chunked", best),  # queued once
        ),
        KEY.text.replace("M=8", "M=16"): (("cpu_chunked", {"chunks": 2, "order": "ascending"}),),
    }
    result, executor = _run(db, trials=3, sampler="random", warm_start=warm)
    launched = [(r.variant, dict(r.params)) for r in executor.requests]
    assert launched[:2] == [("bsp", {}), ("cpu_chunked", best)]
    assert len(launched) == 3 and launched[2] != ("cpu_chunked", best)
    assert ("cpu_chunked", {"chunks": 2, "order": "ascending"}) not in launched[:2]  # another key's


def test_retune_runs_the_winner_it_replaces_right_after_the_baseline(db) -> None:
    import dataclasses

    _run(db, trials=2)
    chosen = {"chunks": 4, "order": "ascending"}  # plant a winner no seed or first sample would give
    db.upsert_winner(dataclasses.replace(db.get_winner(KEY), variant="cpu_chunked", params=chosen), True)
    result, executor = _run(db, trials=2, sampler="random", retune=True)
    assert [(r.variant, dict(r.params)) for r in executor.requests] == [("bsp", {}), ("cpu_chunked", chosen)]


def test_changed_variants_on_resume_ask_for_retune(db) -> None:
    _run(db, trials=2, variants=("cpu_chunked",))
    with pytest.raises(StudyError, match="--retune"):
        _run(db, trials=2, variants=())  # refused even with nothing left to run
    result, executor = _run(db, trials=2, variants=(), retune=True)
    assert result.trials == 1 and [r.variant for r in executor.requests] == ["bsp"]


def test_shape_timeout_stops_before_the_next_trial(db) -> None:
    result, executor = _run(db, trials=4, timeout_s=1e-9)
    assert executor.requests == [] and not result.stored
    assert "--timeout" in result.note


def test_fail_stale_trials_only_marks_dead_tuners(db) -> None:
    import optuna

    study = open_study(db.optuna_storage(), KEY, optuna.samplers.RandomSampler(seed=0))
    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "30"])
    try:
        owners = {
            "dead-pid": (f"{host}:{dead.pid}", time.time()),
            "live-pid": (f"{host}:{live.pid}", time.time()),
            "other-host-silent": ("elsewhere:1", time.time() - STALE_AFTER_S - 5),
            "other-host-beating": ("elsewhere:2", time.time()),
        }
        numbers = {}
        for name, (owner, beat) in owners.items():
            trial = study.ask()
            trial.set_user_attr("owner", owner)
            trial.set_user_attr("heartbeat", beat)
            numbers[trial.number] = name
        fresh = study.ask()  # just asked by another tuner: no owner, no heartbeat yet
        numbers[fresh.number] = "just-asked"
        marked = {numbers[n] for n in fail_stale_trials(study)}
    finally:
        live.kill()
        live.wait()
    assert marked == {"dead-pid", "other-host-silent"}
    states = {numbers[t.number]: t for t in study.get_trials()}
    assert states["dead-pid"].state.name == "FAIL"
    assert states["dead-pid"].user_attrs["failure"].startswith("interrupted")
    assert states["live-pid"].state.name == "RUNNING"
    assert states["other-host-beating"].state.name == "RUNNING"
    assert states["just-asked"].state.name == "RUNNING"
    # silent past the limit, counted from its start: then it is marked too
    later = {numbers[n] for n in fail_stale_trials(study, now=time.time() + STALE_AFTER_S + 5)}
    assert later == {"just-asked", "other-host-beating", "live-pid"}  # (live-pid's process is killed by now)


def test_other_timing_mode_is_refused_before_any_trial(db) -> None:
    """One database keeps one winner per key: tuning it with the other --timing would compare graph-replayed
    medians with eager ones (and count the eager trials as done)."""
    _run(db, trials=2)
    graph = TimingConfig(mode="graph", warmup=0, iters=1, samples=1)
    executor = InlineExecutor()
    with pytest.raises(StudyError, match="--timing eager in this database"):
        tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=graph), executor)
    assert executor.requests == [] and len(_trials(db)) == 2
    # a study from before the attribute: its stored winner's timing decides
    import optuna

    study = optuna.load_study(study_name=KEY.text, storage=db.optuna_storage())
    study.set_user_attr("timing", "graph")  # as a graph-timed study would carry it
    with pytest.raises(StudyError, match="--timing graph in this database"):
        _run(db, trials=4)
    optuna.delete_study(study_name=KEY.text, storage=db.optuna_storage())
    with pytest.raises(StudyError, match="--timing eager in this database"):  # the winner remains
        tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=graph), InlineExecutor())
    result, executor = _run(db, trials=2)  # the same mode goes on
    assert result.trials == 2 and len(executor.requests) == 2  # a fresh study, stamped eager
    assert optuna.load_study(study_name=KEY.text, storage=db.optuna_storage()).user_attrs["timing"] == "eager"


def test_a_baseline_running_in_another_tuner_is_awaited_before_the_winner_is_stored(db) -> None:
    import threading

    import optuna

    from autotaxer.ops import get_op
    from autotaxer.tuner.study import SearchSpace, enqueue_baseline, suggest

    # Another tuner on the same database has taken the baseline and is still running it.
    op = get_op("ag_gemm")
    space = SearchSpace.build(op, KEY, cpu_target(), None)
    study = open_study(db.optuna_storage(), KEY, optuna.samplers.RandomSampler(seed=0))
    enqueue_baseline(study, op, space)
    theirs = study.ask()
    theirs.set_user_attr("owner", "elsewhere:7")
    theirs.set_user_attr("heartbeat", time.time())
    name, _ = suggest(theirs, space)
    assert name == space.baseline

    def finish_later() -> None:
        # Only once this tuner's own two trials are told (its loop then ends and it starts waiting),
        # and a second after that, so the wait is certain whatever the machine's speed.
        give_up = time.monotonic() + 120
        while time.monotonic() < give_up:
            done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
            if len(done) >= 2:
                break
            time.sleep(0.05)
        time.sleep(1.0)
        study.tell(theirs, 1e6)  # slower than anything this tuner finds

    other = threading.Thread(target=finish_later)
    other.start()
    try:
        result, executor = _run(db, trials=3)
    finally:
        other.join()
    assert all(r.variant != space.baseline for r in executor.requests)  # this tuner never ran it
    assert result.stored and result.confirmed, result.note
    assert "waited" in result.note
    (winner,) = db.winners()
    # the other tuner's baseline trial let the winner be stored; its time was confirmed here, beside it
    assert winner.trials == 3 and is_confirmed(winner.env)
    (confirmation,) = executor.confirmations
    assert (space.baseline, {}) in confirmation.entries and winner.bsp_us < 1e6


class InterruptingExecutor(InlineExecutor):
    """Raises KeyboardInterrupt (Ctrl-C) in the trial whose variant is ``variant``, ``times`` times."""

    def __init__(self, variant: str, times: int = 1) -> None:
        super().__init__()
        self.variant, self.left = variant, times

    def run(self, req: TrialRequest, timeout_s: float, on_wait=None) -> list[RankReply]:
        if req.variant == self.variant and self.left:
            self.left -= 1
            raise KeyboardInterrupt
        return super().run(req, timeout_s, on_wait)


def test_an_interrupted_baseline_runs_again_on_resume_and_the_winner_is_stored(db) -> None:
    """Ctrl-C during the BSP baseline: the trial is interrupted, not failed; the resumed run measures the
    baseline again, stores the winner, and ends with as many finished trials as an uninterrupted run."""
    config = TuneConfig(trials=4, timing=FAST)
    with pytest.raises(KeyboardInterrupt):
        tune([KEY], cpu_target(), db, config, InterruptingExecutor("bsp"))
    (first,) = _trials(db)
    assert first.state.name == "FAIL" and first.user_attrs["interrupted"] is True
    assert first.user_attrs["failure"].startswith("interrupted: KeyboardInterrupt")
    result, executor = _run(db)
    assert executor.requests[0].variant == "bsp"  # the interrupted configuration first
    assert result.stored and result.bsp_us is not None and result.trials == 4
    states = [t.state.name for t in _trials(db)]
    assert states.count("COMPLETE") == 4 and states.count("FAIL") == 1
    assert db.get_winner(KEY).trials == 4


def test_a_configuration_interrupted_max_times_is_not_run_again(db) -> None:
    from autotaxer.tuner.study import MAX_INTERRUPTIONS

    config = TuneConfig(trials=4, timing=FAST)
    for _ in range(MAX_INTERRUPTIONS):
        with pytest.raises(KeyboardInterrupt):
            tune([KEY], cpu_target(), db, config, InterruptingExecutor("bsp"))
    result, executor = _run(db)
    assert "bsp" not in [r.variant for r in executor.requests]
    assert not result.stored and "baseline never completed" in result.note


def test_a_trial_without_an_owner_is_interrupted_after_a_minute(db) -> None:
    """A kill between taking a queued trial and recording its owner: RUNNING with no owner. Marked
    interrupted once ``OWNERLESS_AFTER_S`` have passed since its start, not after the 10-minute
    heartbeat limit; a fresh owner-less trial (another tuner's, just taken) is left alone."""
    from autotaxer.tuner.study import OWNERLESS_AFTER_S, counts

    study = open_study(db.optuna_storage(), KEY, None)
    study.enqueue_trial({"variant": "bsp"})
    trial = study.ask()  # RUNNING, no owner
    start = trial.datetime_start.timestamp()
    assert fail_stale_trials(study, now=start + 5) == []
    assert fail_stale_trials(study, now=start + OWNERLESS_AFTER_S + 1) == [trial.number]
    assert counts(study) == {"INTERRUPTED": 1}


def test_a_new_trial_is_created_with_its_owner(db) -> None:
    from autotaxer.tuner.study import ask_owned, owner_tag

    study = open_study(db.optuna_storage(), KEY, None)
    trial = ask_owned(study, owner_tag())
    frozen = study.get_trials(deepcopy=False)[0]
    assert frozen.state.name == "RUNNING" and frozen.number == trial.number == 0
    assert frozen.user_attrs["owner"] == owner_tag() and frozen.user_attrs["heartbeat"] > 0


def test_two_tuners_taking_one_configuration_at_once_leave_one_of_them_running(db) -> None:
    """Each sees the other's RUNNING trial of the same configuration: only the later one is a duplicate
    (both pruning each other would leave, e.g., a shared baseline unmeasured)."""
    from autotaxer.tuner.study import ask_owned, duplicate_of

    study = open_study(db.optuna_storage(), KEY, None)
    first, second = ask_owned(study, "a:1"), ask_owned(study, "b:2")
    for trial in (first, second):
        trial.suggest_categorical("variant", ["bsp"])
    params = {"variant": "bsp"}
    assert duplicate_of(study, params, first.number) is None
    assert duplicate_of(study, params, second.number) == first.number


def test_sampled_trials_follow_the_queued_ones_and_a_resume_keeps_the_budget(db) -> None:
    """``--sampled``: the budget is at least the queued configurations (baseline, seeds) plus that many
    sampler draws, whatever ``--trials`` says; a resumed run counts the same queue and runs nothing more."""
    from autotaxer.tuner.study import queued_points

    first, executor = _run(db, trials=1, sampled=3)
    study_trials = _trials(db)
    queued = sum("fixed_params" in t.system_attrs for t in study_trials)
    assert queued >= 1  # at least the baseline was queued
    assert first.trials == queued + 3 == len(executor.requests)
    import optuna

    assert queued_points(optuna.load_study(study_name=KEY.text, storage=db.optuna_storage())) == queued
    again, executor = _run(db, trials=1, sampled=3)
    assert executor.requests == [] and again.trials == first.trials


class Notes(Reporter):
    """A reporter that keeps the notes a tuning run writes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)


def test_a_budget_spent_on_the_queue_says_so(db) -> None:
    notes = Notes()
    results, _ = tune([KEY], cpu_target(), db, TuneConfig(trials=1, timing=FAST), InlineExecutor(), notes)
    assert results[0].trials == 1
    assert any("the sampler draws none" in n for n in notes.notes), notes.notes
    with pytest.raises(ValueError, match="--sampled: must be >= 0"):
        TuneConfig(sampled=-1).validate()


class FastInItsTrials(InlineExecutor):
    """``cpu_chunked`` takes 1 µs in its trials and bsp 100 µs; the end's confirmation (told apart by its
    ``entries``) times each entry as ``confirm_us`` says: a variant fast only in its trials."""

    def __init__(self, confirm_us: dict[str, float]) -> None:
        super().__init__()
        self.confirm_us = confirm_us

    def run(self, req, timeout_s: float, on_wait=None) -> list[RankReply]:
        from dataclasses import replace

        (reply,) = super().run(req, timeout_s, on_wait)
        if hasattr(req, "entries"):
            return [replace(reply, medians_us=tuple(self.confirm_us[name] for name, _ in req.entries))]
        return [replace(reply, median_us=1.0 if req.variant == "cpu_chunked" else 100.0)]


@pytest.mark.parametrize(
    ("confirm_us", "variant", "speedup"),
    [
        ({"cpu_chunked": 80.0, "bsp": 100.0}, "cpu_chunked", 1.25),
        ({"cpu_chunked": 120.0, "bsp": 100.0}, "bsp", 1.0),
    ],
)
def test_the_stored_speedup_is_the_confirmations_not_the_best_trials(
    db, confirm_us: dict, variant: str, speedup: float
) -> None:
    """The best of the trials (1 µs against bsp's 100 µs) is re-timed beside bsp on fresh inputs, and the
    record holds that ratio; where the confirmation finds it no faster, bsp is the winner."""
    executor = FastInItsTrials(confirm_us)
    (result,), _ = tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=FAST), executor)
    winner = db.get_winner(KEY)
    assert winner.variant == variant and winner.speedup == pytest.approx(speedup)
    assert winner.median_us == confirm_us[variant] and winner.bsp_us == confirm_us["bsp"]
    assert is_confirmed(winner.env) and winner.env["chain"] == "dependent"
    assert confirmed_times(winner.env) == confirm_us  # every entry's time, kept with the record
    assert result.confirmed and result.speedup == pytest.approx(speedup)  # what the CLI prints
    (confirmation,) = executor.confirmations
    assert [name for name, _ in confirmation.entries] == ["cpu_chunked", "bsp"]  # the winner, then the forms
    assert confirmation.seed not in {r.seed for r in executor.requests}  # fresh inputs


def test_back_to_back_timing_is_kept_as_an_option(db) -> None:
    """``chain="back-to-back"``: trials and the confirmation are sent unchained, and the record says so."""
    timing = TimingConfig(mode="eager", warmup=0, iters=1, samples=1, chain="back-to-back")
    executor = InlineExecutor()
    tune([KEY], cpu_target(), db, TuneConfig(trials=2, timing=timing), executor)
    assert {r.timing.chain for r in executor.requests + executor.confirmations} == {"back-to-back"}
    winner = db.get_winner(KEY)
    assert winner.env["chain"] == "back-to-back" and is_confirmed(winner.env) and "link_us" not in winner.env


def test_an_unconfirmed_speedup_is_never_shown() -> None:
    """A search's result whose winner could not be confirmed has times, but no speedup to print."""
    from autotaxer.tuner.progress import ShapeResult

    fields = dict(key=KEY.text, variant="bsp", params={}, median_us=5.0, bsp_us=10.0, trials=1, failed=0,
                  pruned=0, ran=1, wall_s=0.1, stored=True)  # fmt: skip
    assert ShapeResult(**fields).speedup is None
    assert ShapeResult(**fields, confirmed=True).speedup == 2.0


def test_a_finished_key_run_again_keeps_its_confirmed_record(db) -> None:
    """A second run with nothing left to try confirms nothing and never stores the trials' times over the
    confirmed record."""
    _run(db, trials=2)
    first = db.get_winner(KEY)
    result, executor = _run(db, trials=2)
    assert executor.requests == [] and executor.confirmations == []
    again = db.get_winner(KEY)
    assert is_confirmed(again.env) and (again.median_us, again.bsp_us) == (first.median_us, first.bsp_us)
    assert result.confirmed and result.median_us == first.median_us


def test_a_study_resumed_with_the_other_chain_says_so(db) -> None:
    b2b = TimingConfig(mode="eager", warmup=0, iters=1, samples=1, chain="back-to-back")
    tune([KEY], cpu_target(), db, TuneConfig(trials=1, timing=b2b), InlineExecutor())
    notes = Notes()
    tune([KEY], cpu_target(), db, TuneConfig(trials=3, timing=FAST), InlineExecutor(), notes)
    assert any("timed --chain back-to-back, this run's --chain dependent" in n for n in notes.notes), (
        notes.notes
    )
    assert db.get_winner(KEY).env["chain"] == "dependent"  # confirmed this run's way


def test_a_sampled_trial_killed_before_its_parameters_is_not_queued_again() -> None:
    """An interrupted trial with no parameters names no configuration: resuming queues nothing for it
    (it was queued as ``{}`` at every resume and left WAITING), while an interrupted configuration is."""
    import optuna
    from optuna.trial import TrialState

    from autotaxer.tuner.study import ask_owned, mark_interrupted, requeue_interrupted

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    empty = ask_owned(study, "host:1")  # killed before suggest() stored anything
    mark_interrupted(study, empty._trial_id, "killed")
    study.enqueue_trial({"x": 1})
    point = ask_owned(study, "host:1")
    point.suggest_int("x", 0, 3)
    mark_interrupted(study, point._trial_id, "killed")
    assert requeue_interrupted(study) == [{"x": 1}]
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [{"x": 1}]


@pytest.mark.parametrize("replayed", [True, False])
def test_a_winner_timed_as_graph_replays_says_so(db, monkeypatch, replayed: bool) -> None:
    """A winner whose trials were CUDA-graph replays (its op lists it in ``Op.replayed``, on CUDA) is stored
    with ``env["launch"] = "replay"``: records timed before replays (every launch from Python) are told
    apart. Here the CPU winner is declared replayed, as ``copy_engine`` is on CUDA."""
    import autotaxer.runtime.replay as replay

    monkeypatch.setattr(replay, "replayable", lambda opobj, variant, device: replayed)
    executor = FastInItsTrials({"cpu_chunked": 80.0, "bsp": 100.0})
    tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=FAST), executor)
    winner = db.get_winner(KEY)
    assert winner.variant == "cpu_chunked"
    assert winner.env.get("launch") == ("replay" if replayed else None)
