"""Warm-up's joint check: winners whose gains in the step are each too small to tell from noise, checked
together against plain BSP.

The in-step check (:mod:`.in_step`) times one key at a time and keeps a winner only when the step gets
faster by more than :data:`~.in_step.MIN_NOISE` with its lower confidence bound above 1. A layer calls
several keys whose winners each save a percent or two of the step, and a check with a few percent of
noise turns every one of them down although together they would save several percent (2xH200 TP2
forward at S=4096: both ``gemm_rs`` winners 1.01x the step each; 4xH100 TP4 forward at S=4096: three
winners 1.02x, 1.02x and 0.94x with 4-24% noise, every key served ``bsp``). So the keys a check turned
down to ``bsp`` whose winner still had a median gain above 1 (*near misses*) are timed once more,
together, when there are at least :data:`MIN_KEYS`: one arm serves every near miss its winner, the other
every one ``bsp``, in the paired rounds of a key's check and with its verdict
(:func:`.in_step._verdict`: a gain above 1 + ``MIN_NOISE`` and a lower bound above 1). When the winners'
arm passes, every near miss is served its winner, its record stored ``kept`` with its own gain
(``in_step_gain``) and the joint one (``in_step_joint``); else they stay ``bsp``. The joint check runs
only while the budget left covers its rounds, and is collective like the keys' checks: every rank runs
the same steps, switching the near misses of its own groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..records import IN_STEP, IN_STEP_GAIN, IN_STEP_JOINT
from .in_step import (
    KEPT,
    StepCheck,
    Verdict,
    _fastest_form_in_step,
    _settle,
    _verdict,
    steps_per_key,
    switched_rounds,
)

#: The fewest near misses checked together (one alone was just checked by itself).
MIN_KEYS = 2
#: Seeds the joint rounds' order (the keys' checks use their place in the schedule).
_JOINT_INDEX = 1 << 20

Checked = tuple[int, str, str, Verdict]  # (place in the schedule, group, key, its check's verdict)


def near_misses(checked: Sequence[Checked]) -> list[Checked]:
    """The checked keys served ``bsp`` instead of a winner whose median gain in the step was above 1."""
    return [c for c in checked if c[3].to_bsp and c[3].winner_gain > 1]  # to bsp: the winner was replaced


def check_near_misses(
    step: Callable[..., Any],
    args: tuple,
    budget: tuple[int, float, float],
    checked: Sequence[Checked],
    own: dict[tuple[str, str], tuple[Any, Any, list[Any]]],
    world: Any,
    graphs: bool,
    say: Any,
    count: int,
) -> dict[int, StepCheck]:
    """Time the near misses of ``checked`` together (see the module docstring); ``budget``: the rounds,
    one step's seconds and the seconds left; ``own``: this rank's keys, ``(group, key)`` -> (runtime,
    record as tuned, arms); ``count``: the keys in the schedule. Returns this rank's keys served their
    winner again, by their place in the schedule. Collective over the default group."""
    rounds, one, left = budget
    misses = near_misses(checked)
    if len(misses) < MIN_KEYS:
        return {}
    if not left >= steps_per_key(rounds, arms=2) * one:
        say.text(f"autotaxer: {len(misses)} near-miss winner(s) not checked together (budget spent)")
        return {}
    say.text(f"autotaxer: checking {len(misses)} near-miss winner(s) together against bsp ({rounds} rounds)")
    mine = [(i, own[(g, k)], v) for i, g, k, v in misses if (g, k) in own]

    def switch(arm: int) -> None:
        for _, (rt, rec, arms), _ in mine:
            rt.serve_decision(rec.key, arms[0] if arm == 0 else arms[-1])

    samples = switched_rounds(step, args, rounds, _JOINT_INDEX, switch, 2, world, graphs)
    joint = _verdict([s for s in world.gather(samples if mine else None) if s is not None])
    say.text(joint_line(len(misses), joint))
    out: dict[int, StepCheck] = {}
    for i, (rt, rec, arms), verdict in mine:
        if joint is None or joint.status != KEPT:
            rt.forget([rec.key])  # served bsp again, as its own check decided
            continue
        out[i] = _settle(rt, rec, jointly_kept(rec, arms, verdict, joint), say, i, count)
    return out


def joint_line(keys: int, joint: Verdict | None) -> str:
    """The progress line of a joint check."""
    if joint is None:
        return f"  together: {keys} near-miss winner(s) not timed"
    verdict = "kept" if joint.status == KEPT else "served bsp"
    how = f"{joint.winner_s * 1e3:.3g} vs {joint.form_s * 1e3:.3g} ms, noise {100 * joint.noise:.1f}%"
    return f"  together: {keys} near-miss winner(s) {joint.gain:.2f}× the step with bsp ({how}): {verdict}"


def jointly_kept(rec: Any, arms: Sequence[Any], verdict: Verdict, joint: Verdict) -> tuple[StepCheck, Any]:
    """The result and record of a near miss kept by the joint check: ``rec`` as tuned, stamped ``kept``
    with its own gain in the step and the joint one."""
    env = {
        **rec.env,
        IN_STEP: KEPT,
        IN_STEP_GAIN: f"{verdict.winner_gain:.4f}",
        IN_STEP_JOINT: f"{joint.gain:.4f}",
    }
    env.update(_fastest_form_in_step(rec, arms, verdict))
    ms = (joint.winner_s * 1e3, joint.form_s * 1e3)
    gains = (verdict.winner_gain, joint.noise)
    result = StepCheck(rec.key.text, rec.variant, arms[-1].variant, KEPT, *gains, *ms, joint=joint.gain)
    return result, dataclasses.replace(rec, env=env)
