"""Tune a list of problem keys: one Optuna study per key, trials on a worker group, winners stored.

Per trial: ask, draw (variant, params), prune invalid combinations before any launch, send the trial to
every rank, tell the result (``COMPLETE`` with the median µs, or ``FAIL`` with ``user_attrs["failure"]``).
Each tell is committed before the next trial starts, and the winner is upserted after every improvement
(marked partial), so killing the tuner loses at most the running trial; re-running the same command
resumes (finished trials are counted, the dead run's ``RUNNING`` trial is marked ``FAIL``).

When a key's search ends, its best trial is confirmed: the winner and the forms it is compared with (the
BSP forms, torch's fused op) are timed side by side on fresh inputs (:class:`ConfirmRequest`), and those
times are what the record holds (``env["confirmed"]``). The best of many noisy trials against one sample
of each form is optimistic; the winner stored is the fastest entry of the confirmation (a form, where the
searched winner is not faster).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._problem import ProblemKey, Target
from ..measure import TimingConfig
from ..records import FASTEST_FORM, is_confirmed, is_partial
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
    draw_untried,
    duplicate_of,
    enqueue_baseline,
    enqueue_configs,
    enqueue_grid,
    enqueue_seeds,
    enqueue_untried,
    fail_stale_trials,
    fastest_form,
    finished,
    is_queued,
    make_sampler,
    mark_interrupted,
    open_study,
    out_of_reach,
    owner_tag,
    queued_points,
    requeue_interrupted,
    split_params,
    suggest,
)
from .worker import PEER_RAISED, ConfirmRequest, RankReply, TrialRequest


class Executor(Protocol):
    """Runs one trial on every rank (a spawned group or the ranks of a torchrun launch)."""

    launches: int
    launch_s: float

    def ensure_started(self) -> None: ...

    def run(
        self, req: TrialRequest | ConfirmRequest, timeout_s: float, on_wait: Callable[[], None] | None = None
    ) -> list[RankReply]: ...


#: The largest ``--seed``: the samplers seed NumPy's generator, which takes 32-bit seeds.
MAX_SEED = 2**32 - 1
#: The input seed of a key's confirmation is :func:`trial_seed` of this trial number (no trial has it).
CONFIRM_NUMBER = -1
#: The confirmation takes this many times the trials' samples (one run per key: its numbers are stored).
CONFIRM_SAMPLES = 2

#: asks pruned in a row (the sampler's repeats, invalid or out-of-reach draws: ~50-90 ms each on a GPU
#: host's SQLite, 1379 of them at one key of the 2xH200 graph tune, 2026-11-28) before the next draw is
#: an untried configuration in reach, or the search ends when none is left
FILL_AFTER = 10


@dataclass(frozen=True)
class TuneConfig:
    """What ``autotaxer tune`` was asked to do (everything but the shapes, the database and the ranks)."""

    trials: int = 32
    # sampler trials after the queued ones (BSP forms, warm starts, seeds): the budget is at least those
    sampled: int = 0
    timeout_s: float | None = None  # per shape
    # a sampler draw of a variant whose fastest trial is this many times the key's fastest is pruned (0: off)
    reach: float = 0.0
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
        if not (self.reach == 0 or 1 < self.reach < math.inf):  # NaN fails too
            raise ValueError(f"--reach: must be 0 (off) or a finite ratio > 1, got {self.reach}")
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
    prepare_s: float = 0.0  # the slowest rank's workspace set-up
    check_s: float = 0.0  # the slowest rank's first call and reference check


@dataclass(frozen=True)
class _Confirmed:
    """A key's confirmation: each entry's median µs (the slowest rank's; None: it failed), the link's."""

    times: dict[str, float]
    link_us: float | None = None

    def text(self) -> str:
        """``bsp=100.2,push=61.5``: every entry's confirmed µs, for the record's environment."""
        return ",".join(f"{name}={us:.4g}" for name, us in self.times.items())

    def fastest(self, names: tuple[str, ...] | list[str]) -> str | None:
        """The fastest confirmed entry among ``names``, or None."""
        timed = [(self.times[n], n) for n in names if n in self.times]
        return min(timed)[1] if timed else None


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
    return _Outcome(
        median_us=max(medians),
        rel_err=rel,
        timing_s=timing,
        prepare_s=max(r.prepare_s for r in replies),
        check_s=max(r.check_s for r in replies),
    )


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
        chain = study.user_attrs.get("chain", "back-to-back" if study.get_trials(deepcopy=False) else None)
        if chain is None:
            study.set_user_attr("chain", cfg.timing.chain)
        elif chain != cfg.timing.chain:  # the search goes on; the end's confirmation times every entry anew
            self.reporter.note(
                f"{self.key.text}: earlier trials were timed --chain {chain}, this run's --chain "
                f"{cfg.timing.chain} (the confirmation re-times the winner and the forms this run's way)"
            )
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
            wanted = max(cfg.trials, queued + cfg.sampled)
            valid = self.space.count_valid(self.op, limit=wanted + 1)  # past the budget: no matter
            target = min(wanted, valid)
            if target <= queued and target < valid:
                self.reporter.note(
                    f"{self.key.text}: the {target} trial(s) go to the {queued} queued configurations (BSP "
                    "forms, warm starts, seeds); the sampler draws none: raise --trials or --sampled"
                )
        c = counts(study)
        self.reporter.shape_start(self.index, self.n_shapes, self.key.text, target, finished(c))
        deadline = None if cfg.timeout_s is None else t_shape + cfg.timeout_s
        asks, note, cut_short, idle = 0, "", False, 0
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
                note = f"stopped after {asks} asks: what is left is invalid, repeated or out of reach"
                break
            asks += 1
            idle = 0 if self._one_trial(study, target, TrialState) else idle + 1
            if idle >= FILL_AFTER and cfg.sampler != "grid" and not c.get("WAITING", 0):
                idle = 0
                rng = random.Random(trial_seed(cfg.seed, asks))
                point, exhausted = draw_untried(study, self.op, self.space, cfg.reach, rng)
                if exhausted:
                    note = "every configuration in reach has run"
                    break
                if point is not None:
                    enqueue_untried(study, point)
        waited = self._await_baseline_elsewhere(study, deadline)
        if waited:
            note = (note + "; " if note else "") + waited
        before = self.db.get_winner(self.key)
        if self.ran == 0 and before is not None and is_confirmed(before.env) and not is_partial(before.env):
            confirmation, why = None, ""  # nothing measured since its confirmation: the record stands
        else:
            confirmation, why = self._confirm(study)
        if why:
            note = (note + "; " if note else "") + why
        self._store_winner(study, final=True, partial=cut_short, confirmed=confirmation)
        c = counts(study)
        best = best_trial(study)
        bsp = best_bsp(study, self.space)
        stored = self.db.get_winner(self.key)
        variant, params = split_params(best.params) if best is not None else (None, {})
        median_us = best.value if best is not None else None
        bsp_us = bsp.value if bsp is not None else None
        confirmed = stored is not None and is_confirmed(stored.env)
        if confirmed:  # what the record holds (the side-by-side times), not the best trials
            variant, params = stored.variant, dict(stored.params)
            median_us, bsp_us = stored.median_us, stored.bsp_us
        if best is not None and bsp is None:
            note = (note + "; " if note else "") + "baseline never completed: no winner stored"
        return ShapeResult(
            key=self.key.text,
            variant=variant,
            params=params,
            median_us=median_us,
            bsp_us=bsp_us,
            confirmed=confirmed,
            trials=finished(c),
            failed=c.get("FAIL", 0),
            pruned=c.get("PRUNED", 0),
            ran=self.ran,
            wall_s=time.monotonic() - t_shape,
            stored=stored is not None,
            note=note,
            overheads_ms=tuple(self.overheads),
        )

    def _confirm(self, study: Any) -> tuple[_Confirmed | None, str]:
        """Time the study's best configuration and each compared form's best (the BSP forms, torch's fused
        op) side by side on fresh inputs; ``(the confirmation or None, a note when it failed)``."""
        from dataclasses import replace

        best = best_trial(study)
        if best is None or best_bsp(study, self.space) is None:
            return None, ""
        winner = split_params(best.params)
        entries = [winner]
        for name in self._compared_forms():
            form_best = best_trial(study, name)
            if form_best is not None and name != winner[0]:
                entries.append(split_params(form_best.params))
        timing = self.config.timing
        req = ConfirmRequest(
            self.op.name,
            self.key,
            tuple(entries),
            trial_seed(self.config.seed, CONFIRM_NUMBER),
            replace(timing, samples=CONFIRM_SAMPLES * timing.samples),
        )
        self.executor.ensure_started()
        try:
            replies = self.executor.run(req, self.config.trial_timeout_s)
        except TrialAborted as e:
            return None, f"confirmation failed ({e.reason}): the best trial is stored unconfirmed"
        errors = [r.error for r in replies if r.error]
        if errors:
            return None, f"confirmation failed ({errors[0]}): the best trial is stored unconfirmed"
        per_entry = zip(*(r.medians_us for r in replies), strict=True)
        times = {}
        for (name, _), medians in zip(entries, per_entry, strict=True):
            if all(m is not None and math.isfinite(m) and m > 0 for m in medians):
                times[name] = max(medians)
        done = _Confirmed(times, replies[0].link_us)
        if done.fastest(self.space.forms or (self.space.baseline,)) is None or winner[0] not in times:
            return None, "confirmation failed (an entry did not run): the best trial is stored unconfirmed"
        return done, ""

    def _compared_forms(self) -> list[str]:
        """The searched forms a winner is compared with: the BSP forms, then torch's fused ops."""
        forms = [*(self.space.forms or (self.space.baseline,)), *self.op.fallback_forms(self.target)]
        return [n for n in dict.fromkeys(forms) if n in self.space.names]

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

    def _one_trial(self, study: Any, target: int, TrialState: Any) -> bool:
        """Ask for a trial and run it, or prune it before it launches (invalid, a repeat, out of reach);
        whether it launched."""
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
            if reason is None and self.config.reach and not is_queued(study, trial):
                reason = out_of_reach(study, name, self.config.reach)
            if reason is not None:
                trial.set_user_attr("pruned", reason)
                study.tell(trial, state=TrialState.PRUNED)
                told = True
                self._emit(study, trial.number, name, params, "PRUNED", target, t0, _Outcome(failure=reason))
                return False
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
            if outcome.failure is None:
                trial.set_user_attr("prepare_ms", outcome.prepare_s * 1e3)
                trial.set_user_attr("check_ms", outcome.check_s * 1e3)
            try:
                if outcome.failure is None:
                    trial.set_user_attr("median_us", outcome.median_us)
                    study.tell(trial, outcome.median_us)
                else:
                    trial.set_user_attr("failure", outcome.failure)
                    study.tell(trial, state=TrialState.FAIL)
            except UpdateFinishedTrialError:  # another tuner took it for abandoned: its result is dropped
                self.reporter.note(f"{self.key.text}: trial {trial.number} was ended by another tuner")
                return True
            told = True
            if outcome.failure is None:
                self._store_winner(study, final=False)
            overhead_ms = (time.perf_counter() - t0 - outcome.timing_s) * 1e3
            self.overheads.append(overhead_ms)
            state = "COMPLETE" if outcome.failure is None else "FAIL"
            self._emit(study, trial.number, name, params, state, target, t0, outcome, overhead_ms)
            return True
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
                prepare_ms=outcome.prepare_s * 1e3 if outcome.failure is None else None,
                check_ms=outcome.check_s * 1e3 if outcome.failure is None else None,
            )
        )

    def _store_winner(
        self, study: Any, final: bool, partial: bool = True, confirmed: _Confirmed | None = None
    ) -> None:
        """Upsert the study's best; ``final`` refreshes the trial count. Trials' times never replace a faster
        stored record; a confirmation always does (a luckier earlier sample is not kept over it).
        ``partial``: the search has not ended (while it runs, or its time ran out): stamped in the record's
        environment (``env["search"]``), so a later run resumes it. ``confirmed``: the end's side-by-side
        times, stored instead of the trials' (the winner: its fastest entry), and replacing any unconfirmed
        record of the key."""
        from .._target import software_versions
        from ..records import WinnerRecord
        from ..runtime.kernel_hash import kernel_source_hash
        from ..runtime.replay import replayable

        best = best_trial(study)
        bsp = best_bsp(study, self.space)
        if best is None or bsp is None:
            return
        variant, params = split_params(best.params)
        median_us, bsp_us = best.value, bsp.value
        timing = self.config.timing
        env = {**software_versions(), "timing": timing.mode, "chain": timing.chain}  # how median_us was timed
        form = fastest_form(study, self.op.fallback_forms(self.target))
        if confirmed is not None:
            variant = confirmed.fastest(list(confirmed.times))
            if variant != split_params(best.params)[0]:  # the searched winner was not faster: a form is
                params = split_params(best_trial(study, variant).params)[1]
            median_us = confirmed.times[variant]
            bsp_us = confirmed.times[confirmed.fastest(self.space.forms or (self.space.baseline,))]
            form = confirmed.fastest(self.op.fallback_forms(self.target)) or form
            env["confirmed"] = "interleaved"  # winner and forms re-timed side by side on fresh inputs
            env["confirmed_us"] = confirmed.text()  # every entry's time: a speedup over any form
            if confirmed.link_us is not None:
                env["link_us"] = f"{confirmed.link_us:.3g}"  # the chain's link, subtracted from each time
        if form is not None:  # what dispatch serves untuned keys near this one
            env[FASTEST_FORM] = form
        if timing.mode == "eager" and replayable(self.op, self.op.variants[variant], self.target.device_type):
            env["launch"] = "replay"  # its trials, as its calls, were CUDA-graph replays (runtime/replay.py)
        if partial or not final:
            env["search"] = "partial"
        record = WinnerRecord(
            key=self.key,
            variant=variant,
            params=params,
            median_us=median_us,
            bsp_us=bsp_us,
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
        if confirmed is None and stored is not None and is_confirmed(stored.env):
            return  # a confirmed record is never replaced by the trials' optimistic times
        fields = lambda r: (r.variant, r.params, r.median_us, r.bsp_us, r.trials, is_partial(r.env))
        same = stored is not None and fields(stored) == fields(record) and stored.env == record.env
        if not same:  # a stored time no faster than ours is this study's (or worse): refresh the counts
            replace = (
                stored is None
                or record.median_us <= stored.median_us
                or confirmed is not None  # the latest side-by-side re-timing, not the best of noisy runs
                or stored.env.get("chain", "back-to-back") != timing.chain  # times of another chain
            )
            self.db.upsert_winner(record, replace=replace)


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
