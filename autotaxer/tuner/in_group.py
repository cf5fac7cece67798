"""Tuning in the model's own processes: the keys a running group missed, tuned by that group.

:func:`tune_in_group` is collective over a runtime's group. Rank 0 owns the studies and the database (it
alone writes). For each key it takes the key's claim (one tuner at a time per key, on every host of a
shared database), seeds the key's study with the nearest tuned configurations
(:mod:`autotaxer.tuner.nearby`) and runs ``autotaxer tune``'s trial loop (:func:`autotaxer.tuner.tune`)
on an executor that sends each trial to the group's ranks
(:class:`~autotaxer.tuner.distributed.LaunchedGroup`): the same validation against the fp32 reference
into NaN-poisoned outputs, the same timing (median, max over ranks), the same consensus, the same study,
resumable. The other ranks run what they are sent (:func:`~autotaxer.tuner.distributed.follow`). Then
rank 0 broadcasts the winners and every rank's runtime serves them from the keys' next call.

Faults: a candidate that raises on any rank, fails validation, or whose kernels' waits on a peer give up
(``peer_timeout_s``) is a failed trial and the model goes on. A trial still running after
``trial_timeout_s`` is recorded failed by a watchdog, so no later launch runs it again; the ranks stay
in it until it returns. A killed process loses only its running trial: every finished one is committed,
and the next launch resumes the key's study (the claim of a process that is gone is taken over).
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, TextIO

from .._problem import ProblemKey
from ..records import is_confirmed

#: A claim whose owner has not renewed it for this long (and at least two trial timeouts) is abandoned.
MIN_LEASE_S = 60.0
#: How often a tuner waiting for another host's key looks at the database again.
POLL_S = 0.5
#: A trial counts as reaching the key's best when within this fraction of it (``KeyResult.reached_at``).
REACHED_WITHIN = 0.02


class GroupTuningError(RuntimeError):
    """Tuning in the group could not run (its database cannot be opened or written); raised on every
    rank."""


@dataclass(frozen=True)
class TuningBudget:
    """What tuning in the model's processes may spend.

    ``budget_s``: seconds for all keys together (a trial running when it is spent finishes);
    ``key_budget_s``: at most per key (None: what is left of ``budget_s`` shared by the keys left);
    ``trials``: at most per key; ``trial_timeout_s``: a trial running longer is recorded failed;
    ``fleet_wait_s``: how long to wait for a key another process is tuning (0: serve it as before, at
    once); ``seed_nearby``: start each search from the nearest tuned configurations; ``variants``: the
    variants to try besides the BSP forms (None: each op's default space); ``timing``: how trials are
    timed, ``eager`` or ``graph`` (CUDA-graph replays, for a step the caller replays in a graph; None:
    the runtime's ``timing``, else eager).
    """

    budget_s: float = 180.0
    key_budget_s: float | None = None
    trials: int = 32
    trial_timeout_s: float = 120.0
    fleet_wait_s: float = 60.0
    seed_nearby: bool = True
    variants: tuple[str, ...] | None = None
    timing: str | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value is unusable."""
        for name in ("budget_s", "fleet_wait_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"{name}: must be a finite number of seconds >= 0, got {value!r}")
        for name in ("key_budget_s", "trial_timeout_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        if not (isinstance(self.trials, int) and self.trials >= 1):
            raise ValueError(f"trials: must be an integer >= 1, got {self.trials!r}")
        if self.timing not in (None, "eager", "graph"):
            raise ValueError(f"timing: must be 'eager', 'graph' or None, got {self.timing!r}")
        if self.variants is not None:
            from ..ops import variant_names

            known = variant_names()
            unknown = [v for v in self.variants if v not in known]
            if unknown:
                raise ValueError(f"variants: unknown {', '.join(unknown)} (known: {', '.join(known)})")


@dataclass(frozen=True)
class KeyResult:
    """What became of one key: ``status`` is ``tuned`` (by this group now), ``found`` (tuned by another
    process meanwhile) or ``skipped`` (``note`` says why; it is served as before)."""

    key: str
    status: str
    variant: str | None = None
    params: dict[str, Any] | None = None
    median_us: float | None = None
    bsp_us: float | None = None
    trials: int = 0  # finished trials of the key's study, every launch's
    ran: int = 0  # trials this group ran
    failed: int = 0
    reached_at: int | None = None  # finished trials until one within REACHED_WITHIN of the best
    seconds: float = 0.0
    note: str = ""
    confirmed: bool = False  # the record's times come from the end's side-by-side confirmation

    @property
    def speedup(self) -> float | None:
        """The fastest BSP form's time over the winner's, where confirmed (else None: never printed)."""
        if not self.confirmed:
            return None
        return self.bsp_us / self.median_us if self.median_us and self.bsp_us else None

    def line(self, index: int, count: int) -> str:
        """The progress line of this key: key, winner, ×fastest BSP form, trials, seconds."""
        from .progress import _short

        head = f"  [{index}/{count}] {_short(self.key)}: "
        if self.status == "skipped":
            return head + f"not tuned ({self.note}); served as before"
        speed = f"{self.speedup:.2f}× the fastest BSP form" if self.speedup else "speedup not confirmed"
        done = f"{self.ran} trial(s) run, {self.failed} failed" if self.status == "tuned" else "found"
        note = f"; {self.note}" if self.note else ""
        return head + f"{self.variant} {speed} ({done}, {self.seconds:.1f} s{note})"


def tune_in_group(
    rt: Any, keys: list[ProblemKey], budget: TuningBudget, progress: TextIO | None = None
) -> tuple[list[KeyResult], bool]:
    """Tune ``keys`` on every rank of ``rt``'s group, store the winners in ``rt``'s database and serve them
    from the keys' next call; ``(results, budget spent)``, the same on every rank. Collective."""
    from .distributed import follow, group_root

    ctx = rt.ctx
    if ctx.rank == 0:
        payload = _Lead(rt, budget, progress).run(keys)
    else:
        follow(ctx, rt.group, leave_group=False)
        payload = None
    if ctx.world_size > 1:
        import torch.distributed as dist

        box = [payload]
        dist.broadcast_object_list(box, src=group_root(rt.group), group=rt.group)
        payload = box[0]
    results, records, error, spent = payload
    if error is not None:
        raise GroupTuningError(error)
    rt.install_records(records, rt.config.tuning_db_url())
    return results, spent


class _Lead:
    """Rank 0's part: claims, studies, the trial loop, the database."""

    def __init__(self, rt: Any, budget: TuningBudget, progress: TextIO | None) -> None:
        from ..measure import TimingConfig
        from .study import owner_tag

        self.rt, self.budget, self.progress = rt, budget, progress
        self.url = rt.config.tuning_db_url()
        self.deadline = time.monotonic() + budget.budget_s
        self.owner = owner_tag()
        #: the trials' timing, and the only one a winner another process stored is taken in
        self.timing_mode = budget.timing or rt.config.timing
        self.timing = TimingConfig.for_device(rt.ctx.target.device_type, self.timing_mode or "eager")
        self.lease_s = max(MIN_LEASE_S, 2 * budget.trial_timeout_s)
        self._nearby: list[Any] | None = None
        #: the most a key's tuning ran past its share (its BSP forms' first timing, the confirmation, the
        #: trial running when the share ran out): taken off the next keys' shares, so the keys together
        #: end by the deadline and what the caller holds back after it (the in-step check) stays its own
        self.overrun_s = 0.0

    def run(self, keys: list[ProblemKey]) -> tuple[list[KeyResult], list[Any], str | None, bool]:
        from ..storage import DatabaseError, open_database
        from .distributed import LaunchedGroup

        executor = LaunchedGroup(self.rt.ctx, self.rt.group, exit_on_timeout=False)
        results: list[KeyResult] = []
        records: list[Any] = []
        error = None
        try:
            db = open_database(self.url)
            try:
                self._say(
                    f"autotaxer: tuning {len(keys)} key(s) dispatch had no record for "
                    f"({self.rt.ctx.target.gpu_model}, world size {self.rt.ctx.world_size}), budget "
                    f"{self.budget.budget_s:.0f} s, database {db.display_url}"
                )
                for i, key in enumerate(keys):
                    result, rec = self._one(db, executor, key, len(keys) - i)
                    results.append(result)
                    if rec is not None:
                        records.append(rec)
                    self._say(result.line(i + 1, len(keys)))
            finally:
                db.close()
        except (DatabaseError, OSError) as e:
            error = f"{self.url}: {e}"
        except Exception as e:  # reported on every rank; a broken group raises again just below
            error = f"{type(e).__name__}: {e}"
        executor.stop(leave_group=False)
        return results, records, error, time.monotonic() >= self.deadline

    def _say(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=self.progress, flush=True)

    # -- one key -----------------------------------------------------------------------------------
    def _one(self, db: Any, executor: Any, key: ProblemKey, keys_left: int) -> tuple[KeyResult, Any]:
        t0 = time.monotonic()
        skipped = lambda why: (KeyResult(key.text, "skipped", seconds=time.monotonic() - t0, note=why), None)
        if self.deadline - t0 <= 0:
            return skipped("budget spent")
        rec = self._stored(db, key)
        if rec is None and db.claim(key, self.owner, self._abandoned).owner != self.owner:
            rec = self._await(db, key, executor)  # another process tunes it: its winner, or its claim let go
            holder = db.claim(key, self.owner, self._abandoned) if rec is None else None
            if holder is not None and holder.owner != self.owner:
                return skipped(f"{holder.owner} is tuning it")
        elif rec is None:
            rec = self._stored(db, key)  # stored by another process between the first look and the claim
        if rec is not None:
            db.release_claim(key, self.owner)
            return _found(key, rec, time.monotonic() - t0, "tuned by another process"), rec
        left = self.deadline - time.monotonic()
        if left <= 0:
            db.release_claim(key, self.owner)
            return skipped("budget spent")
        if self.budget.key_budget_s is None:
            share = left / keys_left - self.overrun_s
        else:
            share = min(left - self.overrun_s, self.budget.key_budget_s)
        if share <= 0:
            db.release_claim(key, self.owner)
            return skipped("budget spent")
        executor.before_trial = lambda: db.renew_claim(key, self.owner)
        started = time.monotonic()
        try:
            result, note = self._tune(db, executor, key, share)
        finally:
            executor.before_trial = None
            db.release_claim(key, self.owner)
            self.overrun_s = max(self.overrun_s, time.monotonic() - started - share)
        rec = db.get_winner(key)
        if rec is None or result is None:
            return skipped(note or "no winner: the BSP forms did not complete within the budget")
        tuned = KeyResult(
            key.text, "tuned", rec.variant, dict(rec.params), rec.median_us, rec.bsp_us, trials=result.trials,
            ran=result.ran, failed=result.failed, reached_at=self._reached_at(db, key),
            seconds=time.monotonic() - t0, note=note, confirmed=is_confirmed(rec.env),
        )  # fmt: skip
        return tuned, rec

    def _tune(self, db: Any, executor: Any, key: ProblemKey, share: float) -> tuple[Any, str]:
        """Run the key's study for at most ``share`` seconds; (its ShapeResult or None, a note)."""
        from . import TuneConfig, tune
        from .study import StudyError, search_defaults

        op_variants = self._variants(key)
        warm = self._seeds(db, key, op_variants) if self.budget.seed_nearby else ()
        sampled, reach = search_defaults(self.rt.ctx.target.device_type)
        config = TuneConfig(
            trials=self.budget.trials,
            sampled=sampled,
            reach=reach,
            timeout_s=share,
            trial_timeout_s=self.budget.trial_timeout_s,
            variants=op_variants,
            timing=self.timing,
            warm_start={key.text: warm} if warm else {},
        )
        try:
            (result,), _ = tune([key], self.rt.ctx.target, db, config, executor)
        except StudyError as e:
            return None, str(e)
        note = f"{len(warm)} nearby configuration(s) first" if warm else ""
        return result, note

    def _variants(self, key: ProblemKey) -> tuple[str, ...] | None:
        """``budget.variants`` that ``key``'s op has and that run here (None: the op's default space)."""
        if self.budget.variants is None:
            return None
        from ..ops import get_op

        runs_here = get_op(key.op).available_variants(self.rt.ctx.target)
        return tuple(v for v in self.budget.variants if v in runs_here)

    def _seeds(self, db: Any, key: ProblemKey, variants: tuple[str, ...] | None) -> tuple:
        """The nearest tuned configurations (database, shipped tables, this runtime's table) in ``key``'s
        space: what its study measures right after the BSP forms."""
        from ..ops import get_op
        from .nearby import nearby_configs
        from .study import SearchSpace

        if self._nearby is None:
            self._nearby = [*db.winners(), *_shipped_records(), *self.rt.table.records.values()]
        op = get_op(key.op)
        space = SearchSpace.build(op, key, self.rt.ctx.target, variants)
        return tuple(nearby_configs(key, self._nearby, op, space))

    # -- the fleet ---------------------------------------------------------------------------------
    def _stored(self, db: Any, key: ProblemKey) -> Any:
        """The database's winner of ``key`` when its search has ended and was timed as this tuning times
        (``timing``, else the runtime's), else None (a partial one is resumed)."""
        from ..records import is_partial, timing_of

        rec = db.get_winner(key)
        if rec is None or is_partial(rec.env):
            return None
        if self.timing_mode and timing_of(rec.env) != self.timing_mode:
            return None
        return rec

    def _abandoned(self, claim: Any) -> bool:
        """Whether ``claim``'s owner is gone: a process of this host that no longer exists, or no heartbeat
        for the lease."""
        import socket

        from .study import _pid_alive

        host, _, pid = claim.owner.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid():
            if not _pid_alive(int(pid)):
                return True
        return time.time() - claim.heartbeat > self.lease_s

    def _await(self, db: Any, key: ProblemKey, executor: Any) -> Any:
        """Wait (``fleet_wait_s``, within the budget) while another process tunes ``key``: its winner once
        stored, else None (when the wait ends first, or when it let go and the claim is ours). The
        followers hear from rank 0 at every look, so none waits in one collective past its timeout."""
        end = min(time.monotonic() + self.budget.fleet_wait_s, self.deadline)
        while True:
            rec = self._stored(db, key)
            if rec is not None:
                return rec
            if db.claim(key, self.owner, self._abandoned).owner == self.owner or time.monotonic() >= end:
                return None
            executor.keep_alive()
            time.sleep(POLL_S)

    def _reached_at(self, db: Any, key: ProblemKey) -> int | None:
        """Finished trials of the key's study, in the order they ran, until the first within
        :data:`REACHED_WITHIN` of its best."""
        import optuna
        from optuna.trial import TrialState

        study = optuna.load_study(study_name=key.text, storage=db.optuna_storage())
        done = [
            t
            for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
            if t.state in (TrialState.COMPLETE, TrialState.FAIL)
        ]
        values = [t.value for t in done if t.state == TrialState.COMPLETE]
        if not values:
            return None
        best = min(values)
        near = best * (1 + REACHED_WITHIN)
        return next(i for i, t in enumerate(done, 1) if t.state == TrialState.COMPLETE and t.value <= near)


def _found(key: ProblemKey, rec: Any, seconds: float, note: str) -> KeyResult:
    return KeyResult(
        key.text, "found", rec.variant, dict(rec.params), rec.median_us, rec.bsp_us, rec.trials,
        seconds=seconds, note=note, confirmed=is_confirmed(rec.env),
    )  # fmt: skip


def _shipped_records() -> list[Any]:
    """Every record of the shipped tables (starting points for any GPU; never served from here)."""
    from ..runtime.table import shipped_table_dir
    from ..table_file import TableFileError, read_table

    folder = shipped_table_dir()
    out: list[Any] = []
    for path in sorted(folder.glob("*.json")) if folder is not None else ():
        try:
            out.extend(read_table(path))
        except TableFileError:  # a broken shipped table seeds nothing; dispatch reports it where it loads
            continue
    return out


class InlineTuner:
    """``RuntimeConfig(tune_misses=...)``: a missed key is tuned at its first call, within the budget (the
    runtime's :class:`~autotaxer.runtime.decisions.MissTuner`; the package's ``_miss_tuner`` makes one for
    a runtime, which never imports the tuner)."""

    def __init__(self, config: Any) -> None:
        self.budget = TuningBudget(budget_s=config.tune_misses_total_s, key_budget_s=config.tune_misses)
        self.spent = False
        self.used_s = 0.0

    def tune(self, rt: Any, key: ProblemKey) -> bool:
        """Tune ``key`` now on every rank; True when it has a winner to serve. Collective."""
        if self.spent:
            return False
        t0 = time.monotonic()
        budget = replace(self.budget, budget_s=max(0.0, self.budget.budget_s - self.used_s))
        progress = sys.stderr if rt.ctx.rank == 0 else None
        try:
            results, self.spent = tune_in_group(rt, [key], budget, progress)
        except GroupTuningError as e:  # the same on every rank: all stop tuning, the model goes on
            warnings.warn(f"autotaxer: tune_misses is off from now on: {e}", RuntimeWarning, stacklevel=2)
            self.spent = True
            return False
        finally:
            self.used_s += time.monotonic() - t0
        return any(r.status != "skipped" for r in results)
