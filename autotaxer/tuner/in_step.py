"""Warm-up's in-step check: a tuned winner is served only where it makes the user's own step faster.

A winner beat its key's fastest form (the best BSP form, or torch's fused op) in isolated trials. Inside
a model the same kernel can still slow the step down: it holds SMs or host threads a neighbour needs,
it absorbs the peers' host skew, its launch costs more than the call it replaces. After tuning,
:func:`check_in_step` times ``step(*args)`` as it runs (eager or compiled) with a checked key served its
winner, then its fastest form, every other key served what it is served now:

- ``rounds`` rounds, each one timed step with each of the two in a shuffled order (seeded: the same on
  every rank); before each timed step an untimed one with the same form (its first call after the
  switch agrees the decision with the other ranks; in the first round two: a CUDA-graph replayed
  variant's first call is eager and its second captures, :mod:`autotaxer.runtime.replay`), then a
  barrier (and on CUDA a device synchronisation); a sample is the wall time to the step's end
  (synchronised on CUDA);
- per form, the median and the interquartile range of its samples on each rank, then the largest of each
  over the key's ranks (the slowest rank sets the step's pace);
- the winner is kept when its median beats the fastest form's by more than noise: by more than the larger
  of the two interquartile ranges, and by more than :data:`MIN_NOISE` of the fastest form's median.
  Otherwise the key is served its fastest form from now on, and its record is stored again as that form
  (default parameters, the form's isolated time), the isolated winner named in ``env["in_step_winner"]``.

Keys are checked one at a time, in the order of their groups' and keys' names; a key is timed with the
keys checked before it served what their checks decided. The check is collective over every rank of
the default process group (a step may span several groups): ranks whose groups do not have a key run the
same steps without switching it. Its time counts in the warm-up's budget: a key is checked only while
the time left (the smallest of any rank) covers its cost (estimated from one step, then what the last
key took); the keys left keep their winner, marked ``unchecked``. A key whose stored record a check has
already kept or replaced (another group of the same launch, another launch on the database) is served as
that check decided, without timing. Every record it decides on is stamped
(``env["in_step"]``, ``env["in_step_gain"]``: :data:`autotaxer.records.IN_STEP`), written by its group's
rank 0 and served on every rank of the group from the key's next call.

What is timed is ``step(*args)``: a step that replays a CUDA graph captured before the warm-up never
reaches dispatch (both forms would replay the same graph): capture after the warm-up. Under
``torch.compile`` the first step of the check traces with the winners, which the graph holds as
autotaxer's custom op; the check switches the key at run time through it, so where the fastest form is
plain BSP its samples time BSP run by the custom op, not the collective and matmul inductor would have
traced and scheduled around (this can favour the winner). A key served BSP after the check whose graph
held the custom op has torch.compile's graphs reset, so the next call traces plain BSP.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .._problem import ProblemKey
from ..records import IN_STEP, IN_STEP_GAIN, IN_STEP_WINNER, in_step_of
from ..runtime.lookup import EXACT, Decision, fastest_form

#: The smallest step-time difference, as a fraction of the fastest form's, that is not noise.
MIN_NOISE = 0.01
#: At most this share of a warm-up's budget is held back from tuning for the check.
CHECK_SHARE = 0.25
#: Seed of the rounds' order (fixed: every rank draws the same order).
_ORDER_SEED = 20261127

KEPT, REPLACED, UNCHECKED = "kept", "replaced", "unchecked"


def steps_per_key(rounds: int) -> int:
    """Calls of the step one key's check makes: an untimed and a timed one per form and round, and one more
    untimed one per form in the first round."""
    return 4 * rounds + 2


def reserve_s(budget_s: float, keys: int, step_s: float, rounds: int) -> float:
    """Seconds of a warm-up's ``budget_s`` held back from tuning for the check of up to ``keys`` winners
    of a step that took ``step_s`` (the recording's, first calls included: an upper bound), at most
    :data:`CHECK_SHARE` of the budget."""
    if rounds == 0 or keys == 0:
        return 0.0
    return min(CHECK_SHARE * budget_s, keys * (steps_per_key(rounds) + 2) * step_s)


@dataclass(frozen=True)
class StepCheck:
    """What the check decided for one key: ``status`` ``kept`` (its winner speeds the step up by more
    than ``noise``), ``replaced`` (it does not: served ``form``) or ``unchecked`` (``note`` says why; its
    winner is served). ``gain``: the step's time with ``form`` over its time with ``winner``."""

    key: str
    winner: str
    form: str
    status: str
    gain: float | None = None
    noise: float | None = None
    winner_ms: float | None = None
    form_ms: float | None = None
    note: str = ""

    @property
    def served(self) -> str:
        """The variant the key is served from now on."""
        return self.form if self.status == REPLACED else self.winner

    def line(self, index: int, count: int) -> str:
        """The progress line of this key: winner, its gain in the step, the times, the verdict."""
        from .progress import _short

        head = f"  [{index}/{count}] {_short(self.key)}: {self.winner} "
        if self.status == UNCHECKED:
            return head + f"not checked in the step ({self.note}); served unchecked"
        verdict = "kept" if self.status == KEPT else f"served {self.form} instead"
        gain = f"{self.gain:.2f}×" if self.gain is not None else "?×"
        how = self.note
        if self.winner_ms is not None and self.form_ms is not None and self.noise is not None:
            how = f"{self.winner_ms:.3g} vs {self.form_ms:.3g} ms, noise {100 * self.noise:.1f}%"
        return head + f"{gain} the step with {self.form} ({how}): {verdict}"


def checkable(rt: Any, key: ProblemKey) -> Any:
    """The record ``rt`` serves ``key`` from when a check should look at it: an exact record whose winner
    is not a form users have without autotaxer, and that no check kept or replaced yet; else None."""
    from ..ops import get_op

    rec = rt.table.records.get(key)
    if rec is None or rec.variant in get_op(key.op).fallback_forms():
        return None
    decision = rt.decide_key(key)
    if decision.source != EXACT or decision.variant != rec.variant:
        return None
    status, _ = in_step_of(rec.env)
    return rec if status in (None, UNCHECKED) else None


def form_decision(rt: Any, rec: Any) -> Decision:
    """The decision serving ``rec``'s key its fastest form (``env["fastest_form"]`` when it runs here,
    else the op's baseline), default parameters."""
    from ..ops import get_op

    op = get_op(rec.key.op)
    name = fastest_form(rec, op)
    variant = op.available_variants(rt.ctx.target).get(name) if name else None
    try:
        params = variant.default_params(rec.key, rt.ctx.target) if variant is not None else None
    except ValueError:
        params = None
    if params is None:
        variant = op.baseline()
        params = variant.default_params(rec.key, rt.ctx.target)
    return Decision(variant.name, dict(params), EXACT, 0.0, rec.key)


def check_in_step(
    step: Callable[..., Any],
    args: tuple,
    candidates: dict[Any, list[ProblemKey]],
    left_s: float,
    rounds: int,
    progress: bool,
) -> list[StepCheck]:
    """Check the winners of ``candidates`` (runtime -> keys) in ``step(*args)`` within ``left_s`` seconds
    (see the module docstring); this rank's groups' results. Collective over the default group."""
    t0 = time.monotonic()
    world = _World()
    own: dict[tuple[str, str], tuple[Any, Any]] = {}  # (group name, key text) -> (runtime, record)
    for rt, keys in candidates.items():
        for key in keys:
            rec = checkable(rt, key)
            if rec is not None:
                own[(group_name(rt.group), key.text)] = (rt, rec)
    everyone = world.gather((sorted(own), left_s))
    schedule = sorted({tuple(e) for entries, _ in everyone for e in entries})
    if not schedule:
        return []
    say = _Say(progress, world.rank == 0)
    cost, left = math.inf, min(rest for _, rest in everyone)
    note = "the check is off (check_rounds=0)" if rounds == 0 else "budget spent"
    if rounds > 0 and left > 0:
        step(*args)  # compiled code traces with the winners; every call's plan is made
        one = _timed(step, args, world)
        spent = world.gather((one, left_s - (time.monotonic() - t0)))
        cost = steps_per_key(rounds) * max(s for s, _ in spent)
        left = min(rest for _, rest in spent)
        say.header(len(schedule), rounds, left)
    results: list[StepCheck] = []
    retrace = False
    for i, entry in enumerate(schedule):
        mine = own.get(entry)
        lead = mine is not None and mine[0].ctx.rank == 0
        done = [r for r in world.gather(_checked_elsewhere(*mine) if lead else None) if r is not None]
        if done:  # another group or process checked the key meanwhile: served as it decided
            if mine is not None:
                results.append(_settle(*mine, _adopted(mine, done[0]), say, i, len(schedule), store=False))
            continue
        if not left >= cost:
            if mine is not None:
                results.append(_settle(*mine, _unchecked(mine, note), say, i, len(schedule)))
            continue
        t1 = time.monotonic()
        decisions = (mine[0].decide_key(mine[1].key), form_decision(*mine)) if mine is not None else None
        samples = _rounds(step, args, rounds, i, mine, decisions, world)
        stats = [_spread(s) for s in samples] if mine is not None else None
        form_us = _form_us(*mine, decisions[1].variant) if mine is not None else None
        traced = mine is not None and mine[0].traced(mine[1].key)
        everyone = world.gather((stats, form_us, traced, time.monotonic() - t1, left_s - (t1 - t0)))
        cost = max(g[3] for g in everyone)
        left = min(g[4] for g in everyone) - cost
        check = _verdict([g[0] for g in everyone if g[0] is not None])
        retrace |= check is not None and check[0] == REPLACED and any(g[2] for g in everyone)
        if mine is not None:
            us = next(g[1] for g in everyone if g[1] is not None)
            results.append(_settle(*mine, _checked(mine, decisions[1], check, us), say, i, len(schedule)))
    _reset_graphs(retrace, say)
    return results


# -- one key ---------------------------------------------------------------------------------------
def _rounds(
    step: Callable[..., Any], args: tuple, rounds: int, index: int, mine: Any, decisions: Any, world: _World
) -> list[list[float]]:
    """Per form (winner, fastest form), the step's seconds in each round; on ranks without the key the
    same steps run unswitched."""
    rng = random.Random(_ORDER_SEED + index)
    samples: list[list[float]] = [[], []]
    for r in range(rounds):
        for arm in rng.sample((0, 1), 2):
            if mine is not None:
                mine[0].serve_decision(mine[1].key, decisions[arm])
            for _ in range(2 if r == 0 else 1):  # untimed: the switch's first call agrees with the other
                step(*args)  # ranks; in the first round a replayed variant's first call and its capture
            samples[arm].append(_timed(step, args, world))
    return samples


def _spread(samples: Sequence[float]) -> tuple[float, float]:
    """(median, interquartile range) of ``samples``."""
    median = statistics.median(samples)
    if len(samples) < 2:
        return median, 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return median, q3 - q1


def _verdict(stats: list) -> tuple[str, float, float, float, float] | None:
    """(status, gain, noise, winner's seconds, form's seconds) from every rank's (median, spread) per form:
    the largest over the key's ranks."""
    if not stats:
        return None
    winner = max(s[0][0] for s in stats)
    form = max(s[1][0] for s in stats)
    spread = max(max(s[0][1], s[1][1]) for s in stats)
    noise = max(MIN_NOISE, spread / form)
    status = KEPT if winner < form * (1 - noise) else REPLACED
    return status, form / winner, noise, winner, form


def _checked(mine: Any, form: Decision, check: Any, form_us: float) -> tuple[StepCheck, Any]:
    """The check's result and the record to serve from now on."""
    from ..runtime.kernel_hash import kernel_source_hash

    _, rec = mine
    status, gain, noise, winner_s, form_s = check
    ms = (winner_s * 1e3, form_s * 1e3)
    result = StepCheck(rec.key.text, rec.variant, form.variant, status, gain, noise, *ms)
    env = {**rec.env, IN_STEP: status, IN_STEP_GAIN: f"{gain:.4f}"}
    if status == KEPT:
        return result, dataclasses.replace(rec, env=env)
    env[IN_STEP_WINNER] = rec.variant
    try:
        kernel_hash = kernel_source_hash(rec.key.op, form.variant)
    except KeyError:
        kernel_hash = None
    params = dict(form.params)
    served = dataclasses.replace(
        rec, variant=form.variant, params=params, median_us=form_us, env=env, kernel_hash=kernel_hash
    )
    return result, served


def _unchecked(mine: Any, note: str) -> tuple[StepCheck, Any]:
    rt, rec = mine
    result = StepCheck(rec.key.text, rec.variant, form_decision(rt, rec).variant, UNCHECKED, note=note)
    if in_step_of(rec.env)[0] == UNCHECKED:
        return result, None  # stored so already
    return result, dataclasses.replace(rec, env={**rec.env, IN_STEP: UNCHECKED})


def _adopted(mine: Any, stored: Any) -> tuple[StepCheck, Any]:
    """The result of a check another group or process stored (``stored``), and that record to serve."""
    rt, _ = mine
    status, gain = in_step_of(stored.env)
    if status == REPLACED:
        winner, form = str(stored.env.get(IN_STEP_WINNER) or "?"), stored.variant
    else:
        winner, form = stored.variant, form_decision(rt, stored).variant
    note = "checked by another group or process"
    return StepCheck(stored.key.text, winner, form, status, gain, note=note), stored


def _checked_elsewhere(rt: Any, rec: Any) -> Any:
    """The database's record of ``rec``'s key when a check kept or replaced it (rank 0 reads), else None."""
    from ..storage import DatabaseError, open_database

    try:
        with open_database(rt.config.tuning_db_url()) as db:
            stored = db.get_winner(rec.key)
    except (DatabaseError, OSError):
        return None
    return stored if stored is not None and in_step_of(stored.env)[0] in (KEPT, REPLACED) else None


def _settle(
    rt: Any,
    rec: Any,
    outcome: tuple[StepCheck, Any],
    say: _Say,
    index: int,
    count: int,
    store: bool = True,
) -> StepCheck:
    """Store (the group's rank 0) and serve (every rank of the group) what the check decided."""
    result, record = outcome
    if record is not None:
        url = rt.config.tuning_db_url()
        if rt.ctx.rank == 0 and store:
            _store(url, record)
        rt.install_records([record], url)
    say.line(rt, result, index, count)
    return result


def _store(url: str, record: Any) -> None:
    from ..storage import DatabaseError, open_database

    try:
        with open_database(url) as db:
            db.upsert_winner(record, replace=True)
    except (DatabaseError, OSError) as e:  # served as decided here; the next launch checks it again
        warnings.warn(f"autotaxer: could not store the in-step check of {record.key.text}: {e}", stacklevel=3)


def _form_us(rt: Any, rec: Any, form: str) -> float | None:
    """The fastest form's isolated time (its best trial in the key's study; rank 0 of the group reads the
    database), else the record's BSP time; None on the other ranks."""
    if rt.ctx.rank != 0:
        return None
    from .study import best_trial

    try:
        import optuna

        from ..storage import open_database

        with open_database(rt.config.tuning_db_url()) as db:
            study = optuna.load_study(study_name=rec.key.text, storage=db.optuna_storage())
            best = best_trial(study, form)
    except Exception:  # no study here (the record came from another database): the BSP time
        best = None
    return float(best.value) if best is not None else float(rec.bsp_us)


def _reset_graphs(retrace: bool, say: _Say) -> None:
    """Drop torch.compile's graphs when one held the custom op of a key now served its form (the same on
    every rank: the next call traces again, collectively)."""
    if not retrace:
        return
    import torch

    torch._dynamo.reset()
    say.text("autotaxer: torch.compile's graphs were reset to trace the keys served their fastest form")


# -- timing on every rank --------------------------------------------------------------------------
class _World:
    """The default process group's collectives (none in a single process)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.on = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.on else 0

    def gather(self, obj: Any) -> list[Any]:
        if not self.on:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.on:
            import torch.distributed as dist

            dist.barrier()


def _timed(step: Callable[..., Any], args: tuple, world: _World) -> float:
    """Seconds of one ``step(*args)`` after a barrier, to its end on the device."""
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.synchronize()
    world.barrier()
    t0 = time.perf_counter()
    step(*args)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def group_name(group: Any) -> str:
    """The name of a runtime's process group (the default group's for None; "" without one): the same on
    every rank, so ranks order groups and keys alike."""
    import torch.distributed as dist

    if group is not None:
        return group.group_name
    return dist.group.WORLD.group_name if dist.is_available() and dist.is_initialized() else ""


class _Say:
    """Progress lines (stderr): the check's on the default group's rank 0 (``lead``), a key's on its group's
    rank 0."""

    def __init__(self, progress: bool, lead: bool) -> None:
        import sys

        self.out: TextIO | None = sys.stderr if progress else None
        self.lead = lead

    def text(self, line: str) -> None:
        if self.out is not None and self.lead:
            print(line, file=self.out, flush=True)

    def header(self, count: int, rounds: int, left: float) -> None:
        self.text(
            f"autotaxer: checking {count} winner(s) in the step against their fastest forms ({rounds} "
            f"round(s) each, {max(left, 0.0):.0f} s of the budget left)"
        )

    def line(self, rt: Any, result: StepCheck, index: int, count: int) -> None:
        if self.out is not None and rt.ctx.rank == 0:
            print(result.line(index + 1, count), file=self.out, flush=True)
