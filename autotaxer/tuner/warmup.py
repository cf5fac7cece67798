"""``autotaxer.warmup(step, *args, budget_s=...)``: tune, on the machine a model runs on, what it calls.

On a machine no shipped table covers (another GPU, world size or hidden size), every key misses and
dispatch serves BSP. A warm-up closes that loop inside the model's own launch:

1. it runs ``step(*args)`` once, eagerly (compiled functions too), serving BSP for every key without an
   exact record and recording every key dispatch decides on any group (both ops, every layout, forward
   and backward); with :func:`autotaxer.async_tp.enable` on, it runs the step a second time as it is,
   compiled, so the fused ops inductor's micro-pipeline pass put in compiled code are seen too;
2. it tunes the keys that missed, and those whose search stopped short in an earlier launch, collectively
   on each group's ranks (:mod:`.in_group`: the tuner's trials, validation, timing and consensus;
   rank 0 writes trials and winners to the runtime's database), within ``budget_s`` in all and
   ``key_budget_s`` per key, printing a line per key on rank 0;
3. every rank serves the winners from the next call; a graph that ``torch.compile`` traced with one of
   those keys is dropped so the next call traces the winner;
4. it checks each winner in the step itself (:mod:`.in_step`): ``step(*args)`` as it runs (eager or
   compiled) timed with the key's winner, its fastest form and plain BSP, interleaved, on every rank; a
   winner (torch's fused op included) that does not make the step faster than plain BSP by more than
   noise is not served: the key is served the arm that does (its fastest form), else plain BSP, and its
   record is stored again as that form (``env["in_step"]``, ``env["in_step_gain"]``, which
   ``autotaxer show`` prints). The check's time counts in ``budget_s`` (up to a quarter of it is
   held back from tuning for it); winners it has no time left for stay served, marked ``unchecked``, and
   a later warm-up on the same database checks them, as it checks the winners ``autotaxer tune`` stored
   in that database (tuned alone: a re-tuned table is judged in the step before it is exported).

The check runs the step twice, then up to ``3 * (2 * check_rounds + 1)`` times per winner checked (more
rounds, up to three times ``check_rounds``, while the budget covers them): pass a step whose
repeats you do not mind (a forward and backward without the optimizer's step, say), or ``check_rounds=0``.

A second launch on the same database finds the winners in its table and tunes nothing. Collective: every
rank of the default process group calls it, with the same step. Before tuning, the ranks compare how their
steps ended and the keys they dispatched: a step that raised on some ranks only, or dispatched differently,
raises ``ConsensusError`` on every rank and nothing is tuned. Call it first, before capturing CUDA graphs:
it drops the plans and workspaces of the keys it tunes (a graph that replays them would read freed
buffers), and a step replayed from a graph never reaches dispatch to be seen, nor switched by the check.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._problem import ProblemKey
from ..runtime._runtimes import RUNTIMES, set_recorder
from ..runtime.lookup import FALLBACK, Decision
from .in_group import KeyResult, TuningBudget, tune_in_group
from .in_step import KEPT, REPLACED, UNCHECKED, StepCheck, check_in_step, checkable, group_name, reserve_s
from .in_step_joint import check_near_misses

#: Rounds of the in-step check per winner at least (each: one timed step with the winner, its fastest form
#: and plain BSP).
CHECK_ROUNDS = 5


@dataclass(frozen=True)
class WarmupReport:
    """What a warm-up did: one result per key it tuned or tried to, the keys the step dispatched, how long
    the step, the tuning and the in-step check took (seconds, this rank's clock), and one check per
    winner the step was timed with (:class:`~autotaxer.tuner.in_step.StepCheck`: kept, replaced by its
    fastest form, or unchecked)."""

    results: tuple[KeyResult, ...]
    seen: int
    step_s: float
    tuning_s: float
    checks: tuple[StepCheck, ...] = ()
    check_s: float = 0.0

    @property
    def tuned(self) -> list[KeyResult]:
        """Keys tuned now or found tuned by another process: served their winner from now on, or their
        fastest form where :attr:`checks` says the winner did not make the step faster."""
        return [r for r in self.results if r.status != "skipped"]

    def served(self, key: str) -> str | None:
        """The variant the warm-up left ``key`` served (its check's, else its result's winner), or None."""
        for c in self.checks:
            if c.key == key:
                return c.served
        return next((r.variant for r in self.results if r.key == key and r.status != "skipped"), None)


class _Recorder:
    """Notes every key a runtime decides while the step runs, and serves BSP for the misses."""

    def __init__(self) -> None:
        self.seen: dict[Any, dict[ProblemKey, Decision]] = {}  # runtime -> key -> its decision

    def note(self, rt: Any, opobj: Any, key: ProblemKey, decision: Decision) -> Decision:
        self.seen.setdefault(rt, {}).setdefault(key, decision)
        if not decision.is_miss:
            return decision
        base = opobj.baseline()
        return Decision(base.name, base.default_params(key, rt.ctx.target), FALLBACK, math.inf)


def warmup(
    step: Callable[..., Any],
    *args: Any,
    budget_s: float = 180.0,
    key_budget_s: float | None = None,
    db_url: str | None = None,
    trials: int = 32,
    trial_timeout_s: float = 120.0,
    fleet_wait_s: float = 60.0,
    seed_nearby: bool = True,
    variants: tuple[str, ...] | None = None,
    progress: bool = True,
    check_rounds: int = CHECK_ROUNDS,
    check_graphs: bool = False,
    timing: str | None = None,
) -> WarmupReport:
    """Run ``step(*args)`` once and tune the keys it dispatched that have no tuned record; collective.

    ``budget_s``: seconds of tuning in all; ``key_budget_s``: at most per key (default: what is left
    shared by the keys left); ``db_url``: the database trials and winners go to (default: the runtime's
    ``db_url``, else the default database; it becomes a table source of the runtime); ``trials``: at
    most per key; ``trial_timeout_s``: a trial running longer is recorded failed; ``fleet_wait_s``: how
    long to wait for a key another process is tuning (it is served as before when the wait ends);
    ``seed_nearby``: start each search from the nearest tuned configurations; ``variants``: the variants
    to try besides the BSP forms (default: each op's default space); ``progress``: a line per key on
    rank 0 (stderr); ``check_rounds``: rounds of the in-step check per winner (0: winners served
    unchecked); ``check_graphs``: the check times ``step(*args)`` captured in a CUDA graph per arm and
    replayed, as a step the caller captures after the warm-up runs (CUDA only; experimental: one of two
    GPU runs crashed, ``docs/design.md``); ``timing``: how the trials are timed, ``eager`` or ``graph``
    (CUDA-graph replays: what a step replayed in a graph runs, without the host time an eager call pays;
    default ``graph`` with ``check_graphs``, else the runtime's ``timing``, else eager). Returns the same
    report on every rank of a group.
    """
    if timing is None and check_graphs:
        timing = "graph"
    budget = TuningBudget(
        budget_s, key_budget_s, trials, trial_timeout_s, fleet_wait_s, seed_nearby,
        tuple(variants) if variants is not None else None, timing,
    )  # fmt: skip
    budget.validate()
    if not (isinstance(check_rounds, int) and check_rounds >= 0):
        raise ValueError(f"check_rounds: must be an integer >= 0, got {check_rounds!r}")
    if not callable(step):
        raise TypeError(f"step: expected a callable, got {type(step).__name__}")
    if check_graphs and not _cuda():
        raise ValueError("check_graphs: CUDA graphs need a CUDA device, and none is available")
    if timing == "graph" and not _cuda():
        raise ValueError("timing: 'graph' times CUDA-graph replays and needs a CUDA device; none is here")
    for rt in _ordered(RUNTIMES.values()):  # read (and then write) the database from the first call on
        rt.use_database(db_url or rt.config.tuning_db_url())
        # decided again, and seen, in the step
        rt.forget([k for k in rt.decided_keys() if _to_tune(rt, k, timing)])
    recorder = _Recorder()
    t0 = time.monotonic()
    set_recorder(recorder)
    failure: Exception | None = None
    try:
        with _eager():
            step(*args)
        if _async_tp_on():  # compiled code reaches torch's fused ops only when it runs compiled
            step(*args)
    except Exception as exc:  # told to every rank below, before any of them tunes
        failure = exc
    finally:
        set_recorder(None)
        for rt, seen in recorder.seen.items():
            rt.forget(seen)  # the recording's BSP decisions go; the next call decides again
    _agree_on_step(recorder, failure)
    step_s = time.monotonic() - t0
    seen = sum(len(s) for s in recorder.seen.values())
    held = reserve_s(budget.budget_s, seen, step_s, check_rounds)  # for the in-step check
    results: list[KeyResult] = []
    candidates: dict[Any, list[ProblemKey]] = {}
    for rt in _ordered(recorder.seen):
        rt.use_database(db_url or rt.config.tuning_db_url())  # a runtime the step created
        candidates[rt] = [k for k in recorder.seen[rt] if _to_check_again(rt, k)]
        keys = [k for k in recorder.seen[rt] if _to_tune(rt, k, timing)]
        if not keys:
            continue
        left = max(0.0, budget.budget_s - held - (time.monotonic() - t0 - step_s))
        out = sys.stderr if progress and rt.ctx.rank == 0 else None
        done, _ = tune_in_group(rt, keys, _with_total(budget, left), out)
        results.extend(done)
        tuned = [ProblemKey.from_text(r.key) for r in done if r.status != "skipped"]
        candidates[rt] += tuned
        _retrace(rt, tuned, out)
    tuning_s = time.monotonic() - t0 - step_s
    left = max(0.0, budget.budget_s - tuning_s)
    checks = check_in_step(
        step, args, candidates, left, check_rounds, progress, check_graphs, together=check_near_misses
    )
    check_s = time.monotonic() - t0 - step_s - tuning_s
    return WarmupReport(tuple(results), seen, step_s, tuning_s, tuple(checks), check_s)


def _agree_on_step(recorder: _Recorder, failure: Exception | None) -> None:
    """Before any tuning, every rank compares how its step ended and the keys it dispatched (over the
    default group); a step that raised on some ranks, or dispatched keys others did not, raises
    :class:`~autotaxer.runtime.agreement.ConsensusError` on every rank (a step that raised on every rank:
    its own error on each). A rank whose step dispatched while its peers were already here met them in
    this exchange: that raised :class:`~autotaxer.runtime.agreement.OutOfStepError` on all of them."""
    import torch.distributed as dist

    from ..runtime.agreement import ConsensusError, OutOfStepError, exchange

    if isinstance(failure, OutOfStepError) or not (dist.is_available() and dist.is_initialized()):
        if failure is not None:
            raise failure
        return
    if dist.get_world_size() == 1:
        if failure is not None:
            raise failure
        return
    groups = {
        group_name(rt.group): (_members(rt.group), sorted(k.text for k in seen))
        for rt, seen in recorder.seen.items()
    }
    outcome = None if failure is None else f"{type(failure).__name__}: {failure}"
    count = sum(len(keys) for _, keys in groups.values())
    what = f"autotaxer.warmup's end of the step ({count} key(s) dispatched)"
    everyone = exchange("warmup", what, (groups, outcome), None)
    failed = [(r, o) for r, (_, o) in enumerate(everyone) if o is not None]
    if failure is not None and len(failed) == len(everyone):
        raise failure  # every rank's step raised: each raises its own
    if failed:
        lines = "; ".join(f"rank {r}: {o}" for r, o in failed)
        raise ConsensusError(
            f"autotaxer.warmup: the step raised on some ranks ({lines}); nothing was tuned"
        ) from failure
    differ = _differing_keys([g for g, _ in everyone])
    if differ:
        raise ConsensusError(
            f"autotaxer.warmup: the ranks' steps dispatched different keys ({differ}); every rank must run "
            "the same step: nothing was tuned"
        )


def _members(group: Any) -> tuple[int, ...]:
    import torch.distributed as dist

    return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def _differing_keys(reports: list[dict[str, tuple[tuple[int, ...], list[str]]]]) -> str:
    """Where the ranks of a group saw different keys on it (``"group G: rank 0 only: K; ..."``), from each
    rank's ``{group name: (its members' global ranks, keys seen on it)}``; empty when they agree."""
    members = {name: m for report in reports for name, (m, _) in report.items()}
    lines = []
    for name, ranks in sorted(members.items()):
        seen = {r: set(reports[r].get(name, ((), []))[1]) for r in ranks}
        if len({frozenset(s) for s in seen.values()}) > 1:
            common = set.intersection(*seen.values())
            only = "; ".join(
                f"rank {r} only: {', '.join(sorted(s - common)) or 'none'}" for r, s in seen.items()
            )
            lines.append(f"group {name}: {only}")
    return "; ".join(lines)


def _with_total(budget: TuningBudget, total_s: float) -> TuningBudget:
    from dataclasses import replace

    return replace(budget, budget_s=total_s)


def _to_tune(rt: Any, key: ProblemKey, timing: str | None = None) -> bool:
    """A key with no exact record, or whose record came from this runtime's database with its search cut
    short (time ran out, or a process was killed) and timed as this warm-up times (``timing``, else the
    runtime's, else eager: a study is resumed in its own timing only): tuned, or resumed. Not a key the
    in-step check has decided (kept or replaced): resuming its search would store the isolated winner over
    that verdict (seen on 2xH200: a second mode's warm-up resumed the keys the first had replaced, and
    served them unchecked)."""
    from ..records import in_step_of, is_partial, timing_of

    if rt.decide_key(key).is_miss:
        return True
    rec = rt.table.records.get(key)
    if in_step_of(rec.env)[0] in (KEPT, REPLACED):
        return False
    if timing_of(rec.env) != (timing or rt.config.timing or "eager"):
        return False
    return is_partial(rec.env) and rt.table.origins.get(key) == rt.config.tuning_db_url()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _to_check_again(rt: Any, key: ProblemKey) -> bool:
    """A key served a winner from this runtime's database that no in-step check judged: one an earlier
    warm-up had no time to check, or one ``autotaxer tune`` stored there (tuned alone, never in the step:
    a table re-tuned on the CLI is checked in the model's step by the first warm-up on its database, and
    exported with the verdicts). Records of other sources (shipped tables, ``AUTOTAXER_TABLE``) are
    served as they are."""
    from ..records import in_step_of

    rec = checkable(rt, key)
    return (
        rec is not None
        and in_step_of(rec.env)[0] in (None, UNCHECKED)
        and rt.table.origins.get(key) == rt.config.tuning_db_url()
    )


def _ordered(runtimes: Any) -> list[Any]:
    """Runtimes in the order of their groups' names: every rank tunes its groups in the same order, so
    ranks in two groups never wait for each other in different ones."""
    return sorted(runtimes, key=lambda rt: group_name(rt.group))


@contextlib.contextmanager
def _eager():
    """Run ``torch.compile``'d functions eagerly (their calls reach dispatch and are seen), where torch
    can (``torch.compiler.set_stance``, torch 2.6+)."""
    import torch

    stance = getattr(torch.compiler, "set_stance", None)
    if stance is None:
        yield
        return
    with stance("force_eager"):
        yield


def _async_tp_on() -> bool:
    """Whether ``autotaxer.async_tp`` serves torch's fused ops: the micro-pipeline pass puts them in
    compiled code only, so the recording runs the step once more as it is, compiled."""
    import sys

    module = sys.modules.get("autotaxer.async_tp")
    return module is not None and module.is_enabled()


def _retrace(rt: Any, keys: list[ProblemKey], out: Any) -> None:
    """Drop ``torch.compile``'s graphs when one traced a tuned key before the warm-up (it holds the old
    decision); the next call traces again with the winner."""
    if not any(rt.traced(k) and rt.decide_key(k).variant != "bsp" for k in keys):
        return
    import torch

    torch._dynamo.reset()
    if out is not None:
        print("autotaxer: torch.compile's graphs were reset to trace the tuned keys", file=out, flush=True)
