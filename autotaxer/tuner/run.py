"""Tune a list of problem keys: one Optuna study per key, trials on a worker group, winners stored.

Per trial: ask, draw (variant, params), prune invalid combinations before any launch, send the trial to
every rank, tell the result (``COMPLETE`` with the median µs, or ``FAIL`` with ``user_attrs["failure"]``).
Each tell is committed before the next trial starts, and the winner is upserted after every improvement,
so killing the tuner loses at most the running trial; re-running the same command resumes (finished trials
are counted, the dead run's ``RUNNING`` trial is marked ``FAIL``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._problem import ProblemKey, Target
from ..measure import TimingConfig
from .group import TrialAborted
from .progress import Reporter, ShapeResult, Summary, TrialEvent, summarize
from .study import (
    SAMPLERS,
    SearchSpace,
    ask_owned,
    best_bsp,
    best_trial,
    check_space,
    check_timing,
    counts,
    delete_study,
    duplicate_of,
    enqueue_baseline,
    enqueue_configs,
    enqueue_grid,
    enqueue_seeds,
    fail_stale_trials,
    fastest_form,
    finished,
    make_sampler,
    mark_interrupted,
    open_study,
    owner_tag,
    queued_points,
    requeue_interrupted,
    split_params,
    suggest,
)
from .worker import PEER_RAISED, RankReply, TrialRequest


class Executor(Protocol):
    """Runs one trial on every rank (a spawned group or the ranks of a torchrun launch)."""

    launches: int
    launch_s: float

    def ensure_started(self) -> None: ...

    def run(
        self, req: TrialRequest, timeout_s: float, on_wait: Callable[[], None] | None = None
    ) -> list[RankReply]: ...


#: The largest ``--seed``: the samplers seed NumPy's generator, which takes 32-bit seeds.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class TuneConfig:
    """What ``autotaxer tune`` was asked to do (everything but the shapes, the database and the ranks)."""

    trials: int = 32
    # sampler trials after the queued ones (BSP forms, warm starts, seeds): the budget is at least those
    sampled: int = 0
    timeout_s: float | None = None  # per shape
    trial_timeout_s: float = 120.0
    seed: int | None = 0
    sampler: str = "tpe"
    variants: tuple[str, ...] | None = None
    retune: bool = False
    timing: TimingConfig = field(default_factory=TimingConfig)
    # key text -> (variant, params) configurations queued right after the baseline (``--warm-start``)
    warm_start: Mapping[str, tuple[tuple[str, Mapping[str, Any]], ...]] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad option."""
        if self.trials < 1:
            raise ValueError(f"--trials: must be >= 1, got {self.trials}")
        if self.sampled < 0:
            raise ValueError(f"--sampled: must be >= 0, got {self.sampled}")
        if self.timeout_s is not None and not 0 < self.timeout_s < math.inf:  # NaN fails too
            raise ValueError(f"--timeout: must be a finite number of seconds > 0, got {self.timeout_s}")
        if not 0 < self.trial_timeout_s < math.inf:  # NaN or inf would turn the watchdog off
            raise ValueError(
                f"--trial-timeout: must be a finite number of seconds > 0, got {self.trial_timeout_s}"
            )
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(
                f"--seed: must be an integer from 0 to {MAX_SEED} (the samplers' range), got {self.seed}"
            )
        if self.sampler not in SAMPLERS:
            raise ValueError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        try:
            self.timing.validate()
        except ValueError as e:
            raise ValueError(f"--timing: {e}") from None


def trial_seed(base: int | None, number: int) -> int:
    """A fresh input seed per trial, reproducible from ``--seed``."""
    return ((base or 0) * 1_000_003 + number * 7_919 + 1) % (2**31 - 1)


@dataclass(frozen=True)
class _Outcome:
    """A trial's result over every rank: why it failed (None: it ran right), its median µs (the slowest
    rank's), the largest relative error (NaN: not checked) and the seconds its ranks spent timing."""

    failure: str | None = None
    median_us: float | None = None
    rel_err: float = math.nan
    timing_s: float = 0.0


def _combine(replies: list[RankReply]) -> _Outcome:
    """The outcome of one trial from every rank's reply."""
    errors = [r.error for r in replies if r.error]
    # a rank whose wait on a peer gave up names the silent peer, and a rank that raised names its error;
    # its peers only see the agreed failure
    errors.sort(key=lambda e: (PEER_RAISED in e, "PeerTimeoutError" not in e))
    rel = max((r.rel_err for r in replies if not math.isnan(r.rel_err)), default=math.nan)
    timing = max(r.timing_s for r in replies)
    if errors:
        return _Outcome(failure=errors[0], rel_err=rel, timing_s=timing)
    medians = [r.median_us for r in replies if r.median_us is not None]
    if len(medians) != len(replies) or not all(math.isfinite(m) and m > 0 for m in medians):
        return _Outcome(failure=f"timing failed: medians {medians}", rel_err=rel, timing_s=timing)
    return _Outcome(median_us=max(medians), rel_err=rel, timing_s=timing)


class _ShapeTuner:
    """The trial loop of one key."""

    def __init__(
        self,
        key: ProblemKey,
        index: int,
        n_shapes: int,
        target: Target,
        db: Any,
        storage: Any,
        config: TuneConfig,
        executor: Executor,
        reporter: Reporter,
    ) -> None:
        from ..ops import get_op

        self.key, self.index, self.n_shapes = key, index, n_shapes
        self.target, self.db, self.storage, self.config = target, db, storage, config
        self.executor, self.reporter = executor, reporter
        self.op = get_op(key.op)
        self.op.validate(key)
        self.space = SearchSpace.build(self.op, key, target, config.variants)
        self.owner = owner_tag()
        self.overheads: list[float] = []
        self.ran = 0

    def run(self) -> ShapeResult:
        from optuna.trial import TrialState

        t_shape = time.monotonic()
        cfg = self.config
        warm = list(cfg.warm_start.get(self.key.text, ()))
        if cfg.retune:  # the winner being replaced runs first (often still the best after a kernel edit)
            previous = self.db.get_winner(self.key)
            if previous is not None:
                warm.insert(0, (previous.variant, dict(previous.params)))
            delete_study(self.storage, self.key)
            self.db.delete_winner(self.key)
        study = open_study(self.storage, self.key, make_sampler(cfg.sampler, cfg.seed, cfg.trials))
        check_space(study, self.space)
        if "timing" not in study.user_attrs:  # check_timing (before the run) refused any other mode
            study.set_user_attr("timing", cfg.timing.mode)
        stale = fail_stale_trials(study)
        if stale:
            self.reporter.note(f"{self.key.text}: marked trial(s) {stale} interrupted")
        again = requeue_interrupted(study)
        if again:
            self.reporter.note(
                f"{self.key.text}: {len(again)} interrupted configuration(s) queued to run again"
            )
        enqueue_baseline(study, self.op, self.space)
        if cfg.sampler != "grid":
            queued = enqueue_configs(study, self.op, self.space, warm)
            if queued:
                self.reporter.note(f"{self.key.text}: {queued} earlier winner(s) queued first")
            enqueue_seeds(study, self.op, self.space)
        if cfg.sampler == "grid":
            target = enqueue_grid(study, self.op, self.space)
        else:  # repeats are pruned, so a small space ends when every valid point has run
            queued = queued_points(study)
            target = min(max(cfg.trials, queued + cfg.sampled), self.space.count_valid(self.op))
            if target <= queued and target < self.space.count_valid(self.op):
                self.reporter.note(
                    f"{self.key.text}: the {target} trial(s) go to the {queued} queued configurations (BSP "
                    "forms, warm starts, seeds); the sampler draws none: raise --trials or --sampled"
                )
        c = counts(study)
        self.reporter.shape_start(self.index, self.n_shapes, self.key.text, target, finished(c))
        deadline = None if cfg.timeout_s is None else t_shape + cfg.timeout_s
        asks, note, cut_short = 0, "", False
        max_asks = 20 * target + 100  # pruned trials cost milliseconds, but a space may be mostly invalid
        while True:
            c = counts(study)
            if cfg.sampler == "grid":
                if c.get("WAITING", 0) == 0:
                    break
            elif finished(c) + c.get("RUNNING", 0) >= target:
                break
            if deadline is not None and time.monotonic() >= deadline:
                note = f"stopped by --timeout {cfg.timeout_s:g} s"
                cut_short = True
                break
            if asks >= max_asks:
                note = f"stopped after {asks} asks: most of the space is invalid"
                break
            asks += 1
            self._one_trial(study, target, TrialState)
        waited = self._await_baseline_elsewhere(study, deadline)
        if waited:
            note = (note + "; " if note else "") + waited
        self._store_winner(study, final=True, partial=cut_short)
        c = counts(study)
        best = best_trial(study)
        bsp = best_bsp(study, self.space)
        stored = self.db.get_winner(self.key)
        variant, params = split_params(best.params) if best is not None else (None, {})
        if best is not None and bsp is None:
            note = (note + "; " if note else "") + "baseline never completed: no winner stored"
        return ShapeResult(
            key=self.key.text,
            variant=variant,
            params=params,
            median_us=best.value if best is not None else None,
            bsp_us=bsp.value if bsp is not None else None,
            trials=finished(c),
            failed=c.get("FAIL", 0),
            pruned=c.get("PRUNED", 0),
            ran=self.ran,
            wall_s=time.monotonic() - t_shape,
            stored=stored is not None,
            note=note,
            overheads_ms=tuple(self.overheads),
        )

    def _await_baseline_elsewhere(self, study: Any, deadline: float | None) -> str:
        """Wait while another tuner sharing this study still runs trials and no baseline has completed.

        Two tuners on one database split a shape's trials; the baseline may be the other's, still
        running when this one's budget is spent. Its result decides whether a winner can be stored, so
        wait for it: at most one trial timeout and 30 s (beyond that its tuner is stuck or gone), less
        when the shape's ``--timeout`` ends first. Dead tuners' trials are marked failed as they are
        found. Returns a note when it waited, else "" (also when a baseline has already completed).
        """
        from optuna.trial import TrialState

        t0 = time.monotonic()
        limit = t0 + self.config.trial_timeout_s + 30.0
        if deadline is not None:
            limit = min(limit, deadline)
        slept = False
        while best_trial(study, self.space.baseline) is None:
            fail_stale_trials(study)
            running = [
                t
                for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.user_attrs.get("owner") != self.owner
            ]
            if not running or time.monotonic() >= limit:
                break
            if hasattr(self.executor, "keep_alive"):  # followers in one collective must not time out
                self.executor.keep_alive()
            time.sleep(0.2)
            slept = True
        return f"waited {time.monotonic() - t0:.1f} s for another tuner's trials" if slept else ""

    def _one_trial(self, study: Any, target: int, TrialState: Any) -> None:
        from optuna.exceptions import UpdateFinishedTrialError

        self.executor.ensure_started()  # relaunch after a fault here, outside the trial's overhead
        t0 = time.perf_counter()
        trial = ask_owned(study, self.owner)
        told = False
        try:
            name, params = suggest(trial, self.space)
            reason = self.op.variants[name].check(self.key, self.target, params)
            dup = duplicate_of(study, trial.params, trial.number) if reason is None else None
            if dup is not None:
                reason = f"duplicate of trial {dup}"
            if reason is not None:
                trial.set_user_attr("pruned", reason)
                study.tell(trial, state=TrialState.PRUNED)
                told = True
                self._emit(study, trial.number, name, params, "PRUNED", target, t0, _Outcome(failure=reason))
                return
            req = TrialRequest(
                self.op.name,
                self.key,
                name,
                params,
                trial_seed(self.config.seed, trial.number),
                self.config.timing,
            )
            beat = lambda: trial.set_user_attr("heartbeat", time.time())
            if hasattr(self.executor, "on_abort"):  # a launched group exits from its watchdog thread

                def record_abort(reason: str) -> None:
                    trial.set_user_attr("failure", reason)
                    study.tell(trial, state=TrialState.FAIL)

                self.executor.on_abort = record_abort
            try:
                outcome = _combine(self.executor.run(req, self.config.trial_timeout_s, on_wait=beat))
            except TrialAborted as e:
                outcome = _Outcome(failure=e.reason)
            self.ran += 1
            overhead_ms = (time.perf_counter() - t0 - outcome.timing_s) * 1e3
            if not math.isnan(outcome.rel_err):
                trial.set_user_attr("rel_err", outcome.rel_err)
            trial.set_user_attr("overhead_ms", overhead_ms)
            try:
                if outcome.failure is None:
                    trial.set_user_attr("median_us", outcome.median_us)
                    study.tell(trial, outcome.median_us)
                else:
                    trial.set_user_attr("failure", outcome.failure)
                    study.tell(trial, state=TrialState.FAIL)
            except UpdateFinishedTrialError:  # another tuner took it for abandoned: its result is dropped
                self.reporter.note(f"{self.key.text}: trial {trial.number} was ended by another tuner")
                return
            told = True
            if outcome.failure is None:
                self._store_winner(study, final=False)
            overhead_ms = (time.perf_counter() - t0 - outcome.timing_s) * 1e3
            self.overheads.append(overhead_ms)
            state = "COMPLETE" if outcome.failure is None else "FAIL"
            self._emit(study, trial.number, name, params, state, target, t0, outcome, overhead_ms)
        except BaseException as exc:
            if not told:  # Ctrl-C, SIGTERM, a database error: never leave this trial RUNNING
                try:  # interrupted, not failed: resume runs its configuration again
                    mark_interrupted(study, trial._trial_id, f"interrupted: {type(exc).__name__}: {exc}")
                except Exception:  # the database may be what failed; resume marks it stale then
                    pass
            raise

    def _emit(
        self,
        study: Any,
        number: int,
        variant: str,
        params: dict[str, Any],
        state: str,
        target: int,
        t0: float,
        outcome: _Outcome,
        overhead_ms: float | None = None,
    ) -> None:
        c = counts(study)
        best = best_trial(study)
        bsp = best_bsp(study, self.space)
        self.reporter.trial(
            TrialEvent(
                shape_index=self.index,
                n_shapes=self.n_shapes,
                key=self.key.text,
                trial=finished(c),
                trials=target,
                number=number,
                variant=variant,
                params=params,
                state=state,
                median_us=outcome.median_us,
                rel_err=None if math.isnan(outcome.rel_err) else outcome.rel_err,
                failure=outcome.failure,
                best_us=best.value if best is not None else None,
                bsp_us=bsp.value if bsp is not None else None,
                wall_ms=(time.perf_counter() - t0) * 1e3,
                overhead_ms=overhead_ms,
            )
        )

    def _store_winner(self, study: Any, final: bool, partial: bool = True) -> None:
        """Upsert the study's best (keeps a faster stored record); ``final`` refreshes the trial count.
        ``partial``: the search has not ended (while it runs, or its time ran out): stamped in the record's
        environment (``env["search"]``), so a later run resumes it."""
        from .._target import software_versions
        from ..records import WinnerRecord, is_partial
        from ..runtime.kernel_hash import kernel_source_hash

        best = best_trial(study)
        bsp = best_bsp(study, self.space)
        if best is None or bsp is None:
            return
        variant, params = split_params(best.params)
        env = {**software_versions(), "timing": self.config.timing.mode}  # how median_us was measured
        form = fastest_form(study, self.op.fallback_forms(self.target))
        if form is not None:  # what dispatch serves untuned keys near this one
            env["fastest_form"] = form
        if partial or not final:
            env["search"] = "partial"
        record = WinnerRecord(
            key=self.key,
            variant=variant,
            params=params,
            median_us=best.value,
            bsp_us=bsp.value,
            trials=finished(counts(study)),
            arch=self.target.arch,
            num_sms=self.target.num_sms,
            env=env,
            kernel_hash=kernel_source_hash(self.key.op, variant),
            device_type=self.target.device_type,
        )
        if not final:
            self.db.upsert_winner(record)
            return
        stored = self.db.get_winner(self.key)
        fields = lambda r: (r.variant, r.params, r.median_us, r.bsp_us, r.trials, is_partial(r.env))
        same = stored is not None and fields(stored) == fields(record)
        if not same:  # a stored time no faster than ours is this study's (or worse): refresh the counts
            self.db.upsert_winner(record, replace=stored is None or record.median_us <= stored.median_us)


def tune(
    keys: list[ProblemKey],
    target: Target,
    db: Any,
    config: TuneConfig,
    executor: Executor,
    reporter: Reporter | None = None,
) -> tuple[list[ShapeResult], Summary]:
    """Tune every key in order on ``executor``; returns per-shape results and the run's summary."""
    import optuna

    config.validate()
    reporter = reporter or Reporter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = db.optuna_storage()
    t0 = time.monotonic()
    launch_s0 = executor.launch_s  # the group starts before the first trial (nothing to do: never)
    if not config.retune:  # refuse mixed timing modes before any trial runs
        for key in keys:
            check_timing(storage, db, key, config.timing.mode)
    results = []
    for i, key in enumerate(keys, start=1):
        tuner = _ShapeTuner(key, i, len(keys), target, db, storage, config, executor, reporter)
        result = tuner.run()
        results.append(result)
        reporter.shape_done(i, len(keys), result)
    # Launch counts are the executor's totals (a group reused across calls was launched before).
    summary = summarize(results, time.monotonic() - t0, executor.launches, executor.launch_s - launch_s0)
    reporter.finish(results, summary)
    return results, summary
