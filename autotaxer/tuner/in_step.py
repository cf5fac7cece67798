"""Warm-up's in-step check: a tuned winner is served only where it makes the user's own step faster.

A winner beat its key's fastest form (the best BSP form, or torch's fused op) in isolated trials. Inside
a model the same kernel can still slow the step down: it holds SMs or host threads a neighbour needs,
it absorbs the peers' host skew, its launch costs more than the call it replaces. The same holds for a
fastest form that is not plain BSP (torch's fused op at four GPUs: 1.11-1.18x BSP alone, a 0.84x
training step under ``torch.compile``). What the user has without autotaxer is plain BSP, so that is the
reference: after tuning, :func:`check_in_step` times ``step(*args)`` as it runs (eager or compiled) with
a checked key served each of its *arms* in turn, every other key served what it is served now. The arms
are the key's winner, its fastest form when that is neither the winner nor ``bsp``, and ``bsp``; a
winner that is itself a form users have without autotaxer (torch's fused op, ``bsp_symm``) is checked
against ``bsp`` alone.

- ``rounds`` rounds (more, up to :data:`MAX_ROUNDS_FACTOR` times as many, while the time left covers them:
  :func:`rounds_to_run`), each one timed step per arm in a shuffled order (seeded: the same on every
  rank); before each timed step an untimed one with the same arm (its first call after the switch agrees
  the decision with the other ranks; in the first round two: a CUDA-graph replayed variant's first call
  is eager and its second captures, :mod:`autotaxer.runtime.replay`), then a barrier (and on CUDA a
  device synchronisation); a sample is the wall time to the step's end (synchronised on CUDA), the
  slowest of the key's ranks (the slowest rank sets the step's pace);
- per arm and round the ratio of ``bsp``'s sample to the arm's (paired: a drift of the machine between
  rounds cancels); the arm's gain is the median of its ratios, its noise how far below the gain the
  one-sided 95% lower confidence bound of that median lies (an order statistic of the ratios);
- an arm speeds the step up when its gain exceeds 1 + :data:`MIN_NOISE` and its lower bound exceeds 1. The
  key is served the arm that does with the largest gain; where none does, the key's fastest form measured
  alone (e.g. torch's fused op) when it is an arm whose median step is not slower than ``bsp``'s (the step
  cannot tell them apart, the op alone can: :func:`tie_arm`), else ``bsp``. When that is not the winner, the
  key is served that arm from now on, and its record is stored again as that form (default parameters,
  the form's isolated time), the isolated winner named in ``env["in_step_winner"]``. The record's
  ``env["fastest_form"]`` (what dispatch serves untuned keys near it) becomes the form that was fastest
  in the step, the isolated one kept in ``env["fastest_form_isolated"]``.

Keys turned down to ``bsp`` whose winner still had a median gain above 1 (near misses: each below the
1% floor) are then timed together, all served their winners against all served ``bsp``, and kept together
when that passes the same verdict (:mod:`.in_step_joint`, which ``autotaxer.warmup`` hands the check).

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
reaches dispatch (all arms would replay the same graph): capture after the warm-up, and pass
``check_graphs=True`` to :func:`autotaxer.warmup`: each arm's step is then captured in a CUDA graph of its
own after its two eager steps and timed as replays, as the captured step will run (host time, which an
eager step pays for every launch and a replay does not, no longer decides); those steps launch every
call eagerly (:func:`autotaxer.runtime.replay.eager_calls`: the step's graph records the launches, and
the variants' own graphs are not replayed in between). Under
``torch.compile`` the first step of the check traces with the winners, which the graph holds as
autotaxer's custom op; the check switches the key at run time through it, so the ``bsp`` arm times BSP
run by the custom op, not the collective and matmul inductor would have traced and scheduled around
(this can favour the other arms). A key served BSP after the check whose graph held the custom op has
torch.compile's graphs reset, so the next call traces plain BSP. A replayed step never reaches dispatch's
poll of the waits on peers: after each timed step every rank looks, and a wait that gave up anywhere stops
the check on every rank (:class:`StepWaitGaveUp`, naming the site) instead of timing steps whose every
wait then gives up after its bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .._capture import gc_paused
from .._problem import ProblemKey
from ..measure import release_graphs
from ..records import FASTEST_FORM, FASTEST_FORM_ISOLATED, IN_STEP, IN_STEP_GAIN, IN_STEP_WINNER, in_step_of
from ..runtime.lookup import EXACT, Decision, fastest_form

#: The smallest step-time gain over ``bsp``'s, as a fraction, that is not noise.
MIN_NOISE = 0.01
#: At most this share of a warm-up's budget is held back from tuning for the check.
CHECK_SHARE = 0.25
#: The most arms a key's check times (winner, fastest form, ``bsp``).
MAX_ARMS = 3
#: The check runs up to this many times the rounds it is given while the time left covers them.
MAX_ROUNDS_FACTOR = 3
#: One-sided confidence of the lower bound an arm's median gain must keep above 1.
CONFIDENCE = 0.95
#: Seed of the rounds' order (fixed: every rank draws the same order).
_ORDER_SEED = 20261127

KEPT, REPLACED, UNCHECKED = "kept", "replaced", "unchecked"


def steps_per_key(rounds: int, arms: int = MAX_ARMS) -> int:
    """Calls of the step one key's check makes: an untimed and a timed one per arm and round, and one more
    untimed one per arm in the first round."""
    return arms * (2 * rounds + 1)


def rounds_to_run(rounds: int, left_s: float, keys: int, step_s: float) -> int:
    """The rounds each of ``keys`` checks runs: ``rounds``, or more (up to :data:`MAX_ROUNDS_FACTOR` times
    as many) while they take at most half of ``left_s`` shared by the keys, a step taking ``step_s``."""
    if rounds == 0 or keys == 0:
        return rounds
    per_key = left_s / (2 * keys)
    more = rounds
    while more < MAX_ROUNDS_FACTOR * rounds and steps_per_key(more + 1) * step_s <= per_key:
        more += 1
    return more


def reserve_s(budget_s: float, keys: int, step_s: float, rounds: int) -> float:
    """Seconds of a warm-up's ``budget_s`` held back from tuning for the check of up to ``keys`` winners
    of a step that took ``step_s`` (the recording's, first calls included: an upper bound), at most
    :data:`CHECK_SHARE` of the budget."""
    if rounds == 0 or keys == 0:
        return 0.0
    return min(CHECK_SHARE * budget_s, keys * (steps_per_key(rounds) + 2) * step_s)


@dataclass(frozen=True)
class StepCheck:
    """What the check decided for one key: ``status`` ``kept`` (its winner speeds the step up over ``form``,
    ``bsp``, by more than ``noise``), ``replaced`` (another arm does, or none: served ``form``) or
    ``unchecked`` (``note`` says why; its winner is served). ``gain``: the step's time with ``form`` over
    its time with ``winner`` (the median of the paired rounds' ratios)."""

    key: str
    winner: str
    form: str
    status: str
    gain: float | None = None
    noise: float | None = None
    winner_ms: float | None = None
    form_ms: float | None = None
    note: str = ""
    joint: float | None = None  # kept by the joint check (:mod:`.in_step_joint`): the near misses' gain

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
        if self.joint is not None:
            together = f"{self.joint:.2f}× together with the other near misses"
            return head + f"{gain} the step with {self.form} alone, {together} ({how}): kept"
        return head + f"{gain} the step with {self.form} ({how}): {verdict}"


def checkable(rt: Any, key: ProblemKey) -> Any:
    """The record ``rt`` serves ``key`` from when a check should look at it: an exact record whose winner
    is not the op's baseline (plain BSP), and that no check kept or replaced yet; else None."""
    from ..ops import get_op

    rec = rt.table.records.get(key)
    if rec is None or rec.variant == get_op(key.op).baseline().name:
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
        return _default_decision(op.baseline(), rt, rec)
    return Decision(variant.name, dict(params), EXACT, 0.0, rec.key)


def _default_decision(variant: Any, rt: Any, rec: Any) -> Decision:
    """The decision serving ``rec``'s key ``variant`` with its default parameters."""
    return Decision(variant.name, dict(variant.default_params(rec.key, rt.ctx.target)), EXACT, 0.0, rec.key)


def arms_of(rt: Any, rec: Any) -> list[Decision]:
    """The decisions ``rec``'s check times: its winner, its fastest form when that is neither the winner
    nor the op's baseline, and the baseline (``bsp``, the reference) last."""
    from ..ops import get_op

    base = get_op(rec.key.op).baseline()
    winner = rt.decide_key(rec.key)
    arms = [winner]
    form = form_decision(rt, rec)
    if form.variant not in (winner.variant, base.name):
        arms.append(form)
    arms.append(_default_decision(base, rt, rec))
    return arms


def check_in_step(
    step: Callable[..., Any],
    args: tuple,
    candidates: dict[Any, list[ProblemKey]],
    left_s: float,
    rounds: int,
    progress: bool,
    graphs: bool = False,
    together: Callable[..., dict[int, StepCheck]] | None = None,
) -> list[StepCheck]:
    """Check the winners of ``candidates`` (runtime -> keys) in ``step(*args)`` within ``left_s`` seconds
    (see the module docstring); this rank's groups' results. Collective over the default group.
    ``graphs``: time each arm's step as CUDA-graph replays (:func:`_rounds`); ``together``: the check of
    the near misses (:func:`.in_step_joint.check_near_misses`, what ``autotaxer.warmup`` passes), run
    after the keys' own checks; None: none."""
    t0 = time.monotonic()
    world = _World()
    own: dict[tuple[str, str], tuple[Any, Any, list[Decision]]] = {}  # (group, key): (runtime, record, arms)
    for rt, keys in candidates.items():
        for key in keys:
            rec = checkable(rt, key)
            if rec is not None:
                own[(group_name(rt.group), key.text)] = (rt, rec, arms_of(rt, rec))
    entries = sorted((g, k, len(arms)) for (g, k), (_, _, arms) in own.items())
    everyone = world.gather((entries, left_s))
    schedule = sorted({tuple(e) for entries, _ in everyone for e in entries})
    if not schedule:
        return []
    say = _Say(progress, world.rank == 0)
    one = cost = math.inf
    left = min(rest for _, rest in everyone)
    note = "the check is off (check_rounds=0)" if rounds == 0 else "budget spent"
    if rounds > 0 and left > 0:
        step(*args)  # compiled code traces with the winners; every call's plan is made
        one = _timed(step, args, world)
        spent = world.gather((one, left_s - (time.monotonic() - t0)))
        one = max(s for s, _ in spent)
        left = min(rest for _, rest in spent)
        rounds = rounds_to_run(rounds, left, len(schedule), one)
        cost = steps_per_key(rounds) * one
        say.header(len(schedule), rounds, left)
    results: dict[int, StepCheck] = {}  # this rank's, by the key's place in the schedule
    checked: list[tuple[int, str, str, Verdict]] = []  # every rank: (index, group, key, verdict)
    retraced: set[tuple[str, str]] = set()  # keys replaced whose graph holds the custom op
    for i, (group, key_text, count) in enumerate(schedule):
        found = own.get((group, key_text))
        mine = found[:2] if found is not None else None
        lead = mine is not None and mine[0].ctx.rank == 0
        if i:  # the last key's verdict is stored (by its group's rank 0) before any rank reads this one's
            world.barrier()
        done = [r for r in world.gather(_checked_elsewhere(*mine) if lead else None) if r is not None]
        if done:  # another group or process checked the key meanwhile: served as it decided
            if mine is not None:
                results[i] = _settle(*mine, _adopted(mine, done[0]), say, i, len(schedule), store=False)
            continue
        if not left >= cost:
            if mine is not None:
                results[i] = _settle(*mine, _unchecked(mine, note), say, i, len(schedule))
            continue
        t1 = time.monotonic()
        arms = found[2] if found is not None else None
        samples = _rounds(step, args, rounds, i, mine, arms, count, world, graphs)
        forms_us = _forms_us(*mine, [a.variant for a in arms[1:]]) if found is not None else None
        traced = mine is not None and mine[0].traced(mine[1].key)
        mine_samples = samples if mine is not None else None
        tie = tie_arm(mine[1], arms) if mine is not None else None
        elapsed = time.monotonic() - t1
        everyone = world.gather((mine_samples, forms_us, traced, elapsed, left_s - (t1 - t0), tie))
        cost = max(g[3] for g in everyone)
        left = min(g[4] for g in everyone) - cost
        tie = next((g[5] for g in everyone if g[5] is not None), None)
        verdict = _verdict([g[0] for g in everyone if g[0] is not None], tie)
        if verdict is not None:
            checked.append((i, group, key_text, verdict))
            if verdict.status == REPLACED and any(g[2] for g in everyone):
                retraced.add((group, key_text))
        if found is not None:
            us = next(g[1] for g in everyone if g[1] is not None)
            results[i] = _settle(*mine, _checked(mine, arms, verdict, us), say, i, len(schedule))
    if together is not None and rounds > 0 and math.isfinite(one):
        budget = (rounds, one, left)
        joint = together(step, args, budget, checked, own, world, graphs, say, len(schedule))
        retraced -= {(group, key_text) for i, group, key_text, _ in checked if i in joint}
        results = {**results, **joint}
    _reset_graphs(bool(retraced), say)
    return [results[i] for i in sorted(results)]


# -- one key ---------------------------------------------------------------------------------------
def _rounds(
    step: Callable[..., Any],
    args: tuple,
    rounds: int,
    index: int,
    mine: Any,
    arms: Sequence[Decision] | None,
    count: int,
    world: _World,
    graphs: bool = False,
) -> list[list[float]]:
    """Per arm, the step's seconds in each round; on ranks without the key the same ``count`` arms' steps
    run unswitched. ``graphs``: each arm's step is captured in a CUDA graph after its first two (eager)
    steps, and every later step of that arm replays the graph."""

    def switch(arm: int) -> None:
        if mine is not None:
            mine[0].serve_decision(mine[1].key, arms[arm])

    return switched_rounds(step, args, rounds, index, switch, count, world, graphs)


def switched_rounds(
    step: Callable[..., Any],
    args: tuple,
    rounds: int,
    index: int,
    switch: Callable[[int], None],
    count: int,
    world: _World,
    graphs: bool = False,
) -> list[list[float]]:
    """Per arm, the step's seconds in each round, ``switch(arm)`` serving an arm before its steps (what
    :func:`_rounds` times for one key; the joint check's arms switch several keys at once); the rounds'
    order is seeded by ``index`` (the same on every rank)."""
    from ..runtime.replay import eager_calls  # torch: imported where the check runs

    rng = random.Random(_ORDER_SEED + index)
    samples: list[list[float]] = [[] for _ in range(count)]
    runs: dict[int, Callable[[], Any]] = {}
    captured: list[Any] = []
    try:
        # graphs: the step's own graph is timed; the variants' graphs are not replayed in between
        with eager_calls() if graphs else contextlib.nullcontext():
            for _ in range(rounds):
                for arm in rng.sample(range(count), count):
                    switch(arm)
                    if arm not in runs:  # untimed: the switch's first call agrees with the other ranks;
                        step(*args)  # without graphs a replayed variant's first call is eager, its second
                        step(*args)  # captures
                        if graphs:
                            runs[arm] = _capture(step, args, captured)
                        else:
                            runs[arm] = functools.partial(step, *args)
                    else:
                        runs[arm]()  # untimed: the switch's first call agrees with the other ranks
                    samples[arm].append(_timed(runs[arm], (), world))
                    _stop_if_a_wait_gave_up(world)
    except BaseException:
        release_graphs(captured, quiet=True)  # the step's error is the one to see
        raise
    release_graphs(captured)
    return samples


class StepWaitGaveUp(RuntimeError):
    """The in-step check stopped: a kernel's wait on a peer gave up during its steps (on some rank)."""


def _stop_if_a_wait_gave_up(world: _World) -> None:
    """Raise :class:`StepWaitGaveUp` on every rank when a wait on a peer gave up on any rank since the last
    look (collective; local: :func:`autotaxer.ops._peer_wait.check`). A step replayed from a CUDA graph
    never reaches dispatch, which polls on every call: flags out of step would make every later wait give
    up after its bound, one after another, while the check went on (2xH200, 2026-11-28: a check spent its
    whole limit in a step)."""
    from ..ops._peer_wait import PeerTimeoutError, check

    try:
        check()
        mine = None
    except PeerTimeoutError as exc:
        mine = f"rank {world.rank}: {exc}"
    reports = [r for r in world.gather(mine) if r]
    if reports:
        raise StepWaitGaveUp(f"autotaxer: the in-step check stopped, a wait on a peer gave up: {reports[0]}")


def _capture(step: Callable[..., Any], args: tuple, captured: list[Any]) -> Callable[[], Any]:
    """``step(*args)`` captured in a CUDA graph (every rank at once: its collectives are captured in the
    same order), added to ``captured`` (to be released with :func:`release_graphs`); returns its replay."""
    import torch

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured.append(graph)
    with gc_paused(), torch.cuda.graph(graph):
        step(*args)
    torch.cuda.synchronize()
    return graph.replay


def _synchronize() -> None:
    """Wait for the device, where CUDA is in use."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def lower_bound(values: Sequence[float], confidence: float = CONFIDENCE) -> float:
    """A one-sided ``confidence`` lower bound of the median of ``values`` (distribution-free: the k-th
    smallest, k the largest with P(Binomial(n, 1/2) < k) <= 1 - confidence); the smallest value when
    there are too few for that confidence."""
    ordered = sorted(values)
    n, k, below = len(ordered), 0, 0.0
    while k < n:
        below += math.comb(n, k) / 2**n  # P(Binomial(n, 1/2) <= k)
        if below > 1 - confidence:
            break
        k += 1
    return ordered[max(k - 1, 0)]


@dataclass(frozen=True)
class Verdict:
    """What a key's samples decide: ``served`` (the index of the arm served from now on: 0 the winner, the
    last ``bsp``), ``status``, and the winner against the arm it is compared with (``bsp`` when kept, the
    served arm when replaced): the median ``gain`` of the paired ratios (that arm's time over the
    winner's), its ``noise`` (how far below the gain its lower confidence bound lies, a fraction), both
    medians in seconds; ``passing``: the arms that sped the step up over ``bsp``, by median gain;
    ``winner_gain``: the winner's median gain over ``bsp``, passing or not; ``to_bsp``: ``bsp`` is served."""

    status: str
    served: int
    gain: float
    noise: float
    winner_s: float
    form_s: float
    passing: tuple[tuple[int, float], ...] = ()
    winner_gain: float = 1.0
    to_bsp: bool = False


def tie_arm(rec: Any, arms: Sequence[Decision]) -> int | None:
    """The arm served when none beats ``bsp`` in the step but this one is not slower (:func:`_verdict`):
    the key's fastest form measured alone, where it is an arm other than ``bsp`` (the winner itself when
    the winner is that form), else None. The step cannot tell such a form from ``bsp``, the op alone can:
    serving it costs the step nothing and gains what it gains per op (2xH200, 2026-11-28: ``ag_gemm``
    M=8192 N=5120 ``nk`` went to ``bsp`` where ``torch_fused`` is 1.23x per op)."""
    from ..ops import get_op

    op = get_op(rec.key.op)
    forms = set(op.fallback_forms())
    isolated = fastest_form(rec, op)
    for i, arm in enumerate(arms[:-1]):
        if arm.variant == isolated and arm.variant in forms:
            return i
    return None


def _verdict(per_rank: list[list[list[float]]], tie: int | None = None) -> Verdict | None:
    """The verdict from every rank of the key's samples (per arm, per round; the last arm ``bsp``). When
    no arm beats ``bsp``, arm ``tie`` (:func:`tie_arm`) is served if its median step is not slower than
    ``bsp``'s, else ``bsp``."""
    if not per_rank:
        return None
    arms = [
        [max(samples) for samples in zip(*(r[a] for r in per_rank), strict=True)]
        for a in range(len(per_rank[0]))
    ]
    ref = len(arms) - 1

    def ratios(num: int, den: int) -> list[float]:
        return [x / y for x, y in zip(arms[num], arms[den], strict=True)]

    gains = {a: (statistics.median(ratios(ref, a)), lower_bound(ratios(ref, a))) for a in range(ref)}
    passing = [a for a, (gain, low) in gains.items() if gain > 1 + MIN_NOISE and low > 1]
    served = max(passing, key=lambda a: gains[a][0]) if passing else ref
    if not passing and tie is not None and 0 <= tie < ref and gains[tie][0] >= 1:
        served = tie
    other = ref if served == 0 else served
    paired = ratios(other, 0)
    gain = statistics.median(paired)
    noise = max(0.0, 1 - lower_bound(paired) / gain)
    status = KEPT if served == 0 else REPLACED
    medians = (statistics.median(arms[0]), statistics.median(arms[other]))
    passed = tuple((a, gains[a][0]) for a in passing)
    return Verdict(status, served, gain, noise, *medians, passed, gains[0][0], served == ref)


def _checked(
    mine: Any, arms: Sequence[Decision], verdict: Verdict, forms_us: dict[str, float]
) -> tuple[StepCheck, Any]:
    """The check's result and the record to serve from now on."""
    from ..runtime.kernel_hash import kernel_source_hash

    _, rec = mine
    form = arms[-1] if verdict.status == KEPT else arms[verdict.served]
    ms = (verdict.winner_s * 1e3, verdict.form_s * 1e3)
    how = (verdict.status, verdict.gain, verdict.noise, *ms)
    result = StepCheck(rec.key.text, rec.variant, form.variant, *how)
    env = {**rec.env, IN_STEP: verdict.status, IN_STEP_GAIN: f"{verdict.gain:.4f}"}
    env.update(_fastest_form_in_step(rec, arms, verdict))
    if verdict.status == KEPT:
        return result, dataclasses.replace(rec, env=env)
    env[IN_STEP_WINNER] = rec.variant
    try:
        kernel_hash = kernel_source_hash(rec.key.op, form.variant)
    except KeyError:
        kernel_hash = None
    params = dict(form.params)
    served = dataclasses.replace(
        rec, variant=form.variant, params=params, median_us=forms_us[form.variant], env=env,
        kernel_hash=kernel_hash,
    )  # fmt: skip
    return result, served


def _fastest_form_in_step(rec: Any, arms: Sequence[Decision], verdict: Verdict) -> dict[str, str]:
    """``env["fastest_form"]`` as the step measured it: of the arms that are forms users have without
    autotaxer (the fastest form, a winner that is one, ``bsp``), the one that sped the step up most over
    ``bsp``, else ``bsp`` (dispatch serves it to untuned keys near this one); the isolated one, where it
    differs, in ``env["fastest_form_isolated"]``. Empty when the record names none."""
    from ..ops import get_op

    op = get_op(rec.key.op)
    forms = set(op.fallback_forms())
    passed = [(gain, arms[a].variant) for a, gain in verdict.passing if arms[a].variant in forms]
    served = arms[verdict.served].variant  # a form served on a tie (:func:`tie_arm`) counts as fastest
    in_step = max(passed)[1] if passed else (served if served in forms else arms[-1].variant)
    isolated = fastest_form(rec, op)
    if isolated is None or isolated == in_step:
        return {}
    return {FASTEST_FORM: in_step, FASTEST_FORM_ISOLATED: isolated}


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


def _forms_us(rt: Any, rec: Any, forms: Sequence[str]) -> dict[str, float] | None:
    """Each of ``forms``' isolated time (its best trial in the key's study, read once; rank 0 of the group
    reads the database), else the record's BSP time; None on the other ranks."""
    if rt.ctx.rank != 0:
        return None
    from .study import best_trial

    bests: dict[str, Any] = {}
    try:
        import optuna

        from ..storage import open_database

        with open_database(rt.config.tuning_db_url()) as db:
            study = optuna.load_study(study_name=rec.key.text, storage=db.optuna_storage())
            bests = {form: best_trial(study, form) for form in forms}
    except Exception:  # no study here (the record came from another database): the BSP time
        bests = {}
    return {
        form: float(bests[form].value) if bests.get(form) is not None else float(rec.bsp_us) for form in forms
    }


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
    _synchronize()
    world.barrier()
    t0 = time.perf_counter()
    step(*args)
    _synchronize()
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
            f"autotaxer: checking {count} winner(s) in the step against bsp and their fastest forms "
            f"({rounds} round(s) each, {max(left, 0.0):.0f} s of the budget left)"
        )

    def line(self, rt: Any, result: StepCheck, index: int, count: int) -> None:
        if self.out is not None and rt.ctx.rank == 0:
            print(result.line(index + 1, count), file=self.out, flush=True)
