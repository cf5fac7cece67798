"""The Optuna study of one problem key: search space, sampler, baseline, resume bookkeeping.

Study name = ``key.text``; storage = the tuning database's Optuna tables. The space is conditional:
``variant`` (categorical, the baseline first) and then ``"{variant}.{param}"`` (categorical) for the chosen
variant's own parameters. Invalid combinations are told ``PRUNED`` before anything launches. The baseline
is enqueued first so every winner has its speedup. Trials carry ``owner`` (``host:pid``) and ``heartbeat``
user attributes, so a resumed run can tell a dead tuner's ``RUNNING`` trials (marked ``FAIL``) from the
trials of a tuner still working on the same study on another machine.
"""

from __future__ import annotations

import math
import os
import random
import socket
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from .._problem import ProblemKey, Target
from ..ops._base import Op, Variant, iter_grid

SAMPLERS = ("tpe", "random", "grid")
#: A RUNNING trial of another host whose heartbeat is older than this is considered abandoned.
STALE_AFTER_S = 600.0
#: A RUNNING trial with no owner yet is abandoned after this long: a live tuner records its owner right
#: after taking the trial (a kill between the two leaves it without one).
OWNERLESS_AFTER_S = 60.0
#: User attribute marking a FAIL trial as interrupted (a killed tuner, Ctrl-C, a database error): it says
#: nothing about its configuration, which runs again on resume, at most :data:`MAX_INTERRUPTIONS` times.
INTERRUPTED = "interrupted"
MAX_INTERRUPTIONS = 3


class StudyError(RuntimeError):
    """The stored study cannot be continued with this configuration."""


def owner_tag() -> str:
    """``host:pid`` of this tuner process."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class SearchSpace:
    """The conditional space of one key: variant names in order and each variant's categorical choices."""

    key: ProblemKey
    target: Target
    variants: tuple[tuple[str, tuple[tuple[str, tuple[Any, ...]], ...]], ...]
    baseline: str
    #: The BSP forms searched (the baseline first): a speedup is against the fastest of them.
    forms: tuple[str, ...] = ()

    @classmethod
    def build(cls, op: Op, key: ProblemKey, target: Target, selected: tuple[str, ...] | None) -> SearchSpace:
        """The BSP forms first (the baseline, then every other available one: always measured, since a
        speedup is against the fastest), then ``selected`` (in the given order; names of other ops'
        variants are theirs, a name no op has is refused) or every available variant of the default
        space (:meth:`Op.in_default_space`)."""
        available = op.available_variants(target)
        base = op.baseline().name
        forms = op.bsp_forms(target)
        if selected is None:
            names = forms + sorted(
                n for n in available if n not in forms and op.in_default_space(n, key.world_size)
            )
        else:
            from ..ops import variant_names

            known = variant_names()
            unknown = [n for n in selected if n not in known]
            if unknown:
                raise ValueError(
                    f"--variants: unknown variant(s) {', '.join(unknown)} (known: {', '.join(known)})"
                )
            mine = [n for n in dict.fromkeys(selected) if n in op.variants]  # other ops' names: theirs
            cannot = [
                f"{n} ({op.variants[n].unavailable_reason(target)})" for n in mine if n not in available
            ]
            if cannot:
                raise ValueError(f"--variants: not available on {target.gpu_model}: {'; '.join(cannot)}")
            names = forms + [n for n in mine if n not in forms]
        variants = tuple(
            (n, tuple((p, tuple(c)) for p, c in op.variants[n].search_space(key, target).items()))
            for n in names
        )
        return cls(key, target, variants, base, tuple(forms))

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.variants]

    def params_of(self, name: str) -> dict[str, tuple[Any, ...]]:
        return dict(dict(self.variants)[name])

    def count_valid(self, op: Op, limit: int = 200_000) -> int:
        """Number of valid points, counting stops at ``limit`` (a search's budget: more need not be
        counted; an ``ag_gemm`` Iris variant's ~240k points take seconds to check)."""
        n = 0
        for name in self.names:
            variant = op.variants[name]
            for params in iter_grid(self.params_of(name)):
                n += variant.check(self.key, self.target, params) is None
                if n >= limit:
                    return n
        return n

    def valid_points(self, op: Op) -> list[dict[str, Any]]:
        """Every valid combination as flat Optuna params (``variant`` + ``"{variant}.{param}"``)."""
        points = []
        for name in self.names:
            variant = op.variants[name]
            for params in iter_grid(self.params_of(name)):
                if variant.check(self.key, self.target, params) is None:
                    points.append(flat_params(name, params))
        return points


def flat_params(variant: str, params: dict[str, Any]) -> dict[str, Any]:
    """Optuna's flat form of (variant, params)."""
    return {"variant": variant, **{f"{variant}.{p}": v for p, v in params.items()}}


def split_params(flat: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(variant, its own params) from Optuna's flat params."""
    variant = flat["variant"]
    prefix = f"{variant}."
    return variant, {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}


def suggest(trial: Any, space: SearchSpace) -> tuple[str, dict[str, Any]]:
    """Draw (variant, params) for ``trial`` from the conditional space."""
    try:
        name = trial.suggest_categorical("variant", space.names)
        params = {
            p: trial.suggest_categorical(f"{name}.{p}", choices)
            for p, choices in space.params_of(name).items()
        }
    except ValueError as exc:  # optuna: choices differ from those stored in this study
        raise StudyError(
            f"study {space.key.text!r} was created with other variants or parameter choices ({exc}); "
            "run with the same --variants, or start over with --retune"
        ) from exc
    return name, params


def make_sampler(name: str, seed: int | None, trials: int) -> Any:
    """The Optuna sampler for ``--sampler``; ``grid`` enqueues the valid points and draws nothing itself."""
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,  # conditional space: model each variant's parameters separately
                n_startup_trials=max(3, min(10, trials // 4)),
            )
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"--sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


def open_study(storage: Any, key: ProblemKey, sampler: Any) -> Any:
    """Create or load the study named ``key.text`` (races between tuners are handled by Optuna)."""
    import optuna

    return optuna.create_study(
        study_name=key.text, storage=storage, sampler=sampler, direction="minimize", load_if_exists=True
    )


def check_space(study: Any, space: SearchSpace) -> None:
    """Record the space in a new study; refuse to continue a study made with other variants or choices."""
    import json

    text = json.dumps([[n, [[p, list(c)] for p, c in params]] for n, params in space.variants])
    stored = study.user_attrs.get("space")
    if stored is None:
        study.set_user_attr("space", text)
    elif stored != text:
        raise StudyError(
            f"study {space.key.text!r} was created with other variants or parameter choices "
            f"(stored: {stored}); run with the same --variants, or start over with --retune"
        )


def check_timing(storage: Any, db: Any, key: ProblemKey, mode: str) -> None:
    """Refuse to tune ``key`` with timing ``mode`` where this database's study or winner of it was timed
    the other way: a graph-replayed median is not comparable with an eager one, and the database keeps one
    winner per key. The study's ``timing`` attribute decides; a study from before it, by its stored winner."""
    import optuna

    from ..records import timing_of

    try:
        theirs = optuna.load_study(study_name=key.text, storage=storage).user_attrs.get("timing")
    except KeyError:  # no study of this key
        theirs = None
    if theirs is None:
        stored = db.get_winner(key)
        theirs = timing_of(stored.env) if stored is not None else None
    if theirs is not None and theirs != mode:
        raise StudyError(
            f"{key.text}: tuned with --timing {theirs} in this database; --timing {mode} needs another "
            "--db (one timing mode per key and database), or --retune to start the key over"
        )


def delete_study(storage: Any, key: ProblemKey) -> bool:
    """Delete the study of ``key``; False when there was none."""
    import optuna

    try:
        optuna.delete_study(study_name=key.text, storage=storage)
    except KeyError:
        return False
    return True


def enqueue_baseline(study: Any, op: Op, space: SearchSpace) -> None:
    """Queue every BSP form (the baseline first), then every other searched form users have without
    autotaxer (torch's fused op: what an untuned key near this one may be served), with their default
    parameters, unless the study has them."""
    others = [n for n in op.fallback_forms() if n in space.names and n not in space.forms]
    for name in [*(space.forms or (space.baseline,)), *others]:
        form: Variant = op.variants[name]
        study.enqueue_trial(
            flat_params(form.name, form.default_params(space.key, space.target)), skip_if_exists=True
        )


def point_of(op: Op, space: SearchSpace, name: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """``params`` of variant ``name`` as a flat point of ``space``; None when the variant is not searched,
    a parameter lies outside the space, or the variant's check refuses the configuration."""
    if name not in space.names:
        return None
    params = op.variants[name].complete_params(params)
    choices = space.params_of(name)
    if set(params) != set(choices) or not all(params[p] in choices[p] for p in choices):
        return None
    if op.variants[name].check(space.key, space.target, dict(params)) is not None:
        return None
    return flat_params(name, dict(params))


def enqueue_configs(study: Any, op: Op, space: SearchSpace, configs: Iterable[tuple[str, Mapping]]) -> int:
    """Queue the ``(variant, params)`` configurations that are points of ``space`` (``--warm-start``:
    previous winners, re-measured first); the number of distinct points among them."""
    points: list[dict[str, Any]] = []
    for name, params in configs:
        point = point_of(op, space, name, params)
        if point is not None and point not in points:  # e.g. one record in both timings' tables
            study.enqueue_trial(point, skip_if_exists=True)
            points.append(point)
    return len(points)


def seed_points(op: Op, space: SearchSpace) -> list[dict[str, Any]]:
    """Each variant's valid seed configurations inside ``space``, as flat params (the baseline's too:
    a fused winner must beat the baseline at its best, not at its default)."""
    per_variant = []
    for name in space.names:
        seeds = op.variants[name].seed_configs(space.key, space.target)
        points = (point_of(op, space, name, p) for p in seeds)
        per_variant.append([p for p in points if p is not None])
    # round robin: every variant's first seed before any variant's second
    return [p for rank in zip_longest(*per_variant) for p in rank if p is not None]


def enqueue_seeds(study: Any, op: Op, space: SearchSpace) -> int:
    """Queue the variants' seed configurations (after the baseline's default) unless already queued."""
    points = seed_points(op, space)
    for point in points:
        study.enqueue_trial(point, skip_if_exists=True)
    return len(points)


def enqueue_grid(study: Any, op: Op, space: SearchSpace) -> int:
    """Queue every valid point not already in the study; the number of valid points."""
    points = space.valid_points(op)
    for point in points:
        study.enqueue_trial(point, skip_if_exists=True)
    return len(points)


def ask_owned(study: Any, owner: str) -> Any:
    """``study.ask()`` that records ``owner`` and a first heartbeat with the trial: a new trial is created
    with them in one transaction; a queued one gets them right after it is taken (a kill in between
    leaves it without an owner, which :func:`fail_stale_trials` treats after :data:`OWNERLESS_AFTER_S`)."""
    from datetime import datetime

    import optuna
    from optuna.trial import FrozenTrial, TrialState

    attrs = {"owner": owner, "heartbeat": time.time()}
    storage = study._storage
    study._thread_local.cached_all_trials = None  # as ask() does: read the storage afresh
    trial_id = study._pop_waiting_trial_id()
    if trial_id is None:
        template = FrozenTrial(
            number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
            datetime_complete=None, params={}, distributions={}, user_attrs=attrs, system_attrs={},
            intermediate_values={}, trial_id=-1,
        )  # fmt: skip
        trial_id = storage.create_new_trial(study._study_id, template_trial=template)
    else:
        for name, value in attrs.items():
            storage.set_trial_user_attr(trial_id, name, value)
    return optuna.Trial(study, trial_id)


def is_interrupted(trial: Any) -> bool:
    """True for a FAIL trial that was interrupted rather than failing on its own."""
    return trial.state.name == "FAIL" and bool(trial.user_attrs.get(INTERRUPTED))


def duplicate_of(study: Any, params: dict[str, Any], number: int) -> int | None:
    """Number of another launched trial with exactly ``params`` (finished, or running and taken earlier;
    an interrupted one only once the configuration was interrupted :data:`MAX_INTERRUPTIONS` times), or
    None."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
    interrupted = []
    for t in study.get_trials(deepcopy=False, states=states):
        if t.number == number or t.params != params:
            continue
        # Two tuners that took the same configuration at once each see the other's RUNNING trial: only
        # the later one yields, else both would prune (a shared baseline then never runs).
        if t.state == TrialState.RUNNING and t.number > number:
            continue
        if not is_interrupted(t):
            return t.number
        interrupted.append(t.number)
    return interrupted[-1] if len(interrupted) >= MAX_INTERRUPTIONS else None


def mark_interrupted(study: Any, trial_id: int, why: str) -> bool:
    """Record ``why`` and end the trial ``FAIL`` + interrupted; False when it had already finished."""
    from optuna.trial import TrialState

    storage = study._storage
    try:
        storage.set_trial_user_attr(trial_id, "failure", why)
        storage.set_trial_user_attr(trial_id, INTERRUPTED, True)
        return bool(storage.set_trial_state_values(trial_id, TrialState.FAIL))
    except RuntimeError:  # finished meanwhile (UpdateFinishedTrialError): nothing to repair
        return False


def requeue_interrupted(study: Any) -> list[dict[str, Any]]:
    """Queue again every configuration whose trials were all interrupted (fewer than
    :data:`MAX_INTERRUPTIONS` times) and that is neither queued, running nor finished otherwise; returns
    the configurations queued. A trial without parameters (sampled, killed before they were stored) names
    no configuration: the sampler draws again."""
    from optuna.trial import TrialState

    interrupted: dict[tuple, int] = {}
    taken: set[tuple] = set()
    params_of: dict[tuple, dict[str, Any]] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.PRUNED:
            continue
        params = t.system_attrs.get("fixed_params", t.params) if t.state == TrialState.WAITING else t.params
        if not params:  # a sampled trial killed before its parameters were stored: no configuration
            continue
        point = tuple(sorted(params.items()))
        params_of[point] = dict(params)
        if is_interrupted(t):
            interrupted[point] = interrupted.get(point, 0) + 1
        else:
            taken.add(point)
    queued = []
    for point, n in interrupted.items():
        if point not in taken and n < MAX_INTERRUPTIONS:
            study.enqueue_trial(params_of[point])
            queued.append(params_of[point])
    return queued


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_stale_trials(study: Any, now: float | None = None) -> list[int]:
    """Mark interrupted (``FAIL`` + :data:`INTERRUPTED`) the RUNNING trials whose tuner is gone; the
    numbers of the trials marked.

    Gone = same host and the owner's pid no longer exists; no heartbeat (else no start) for
    :data:`STALE_AFTER_S`; or no owner recorded :data:`OWNERLESS_AFTER_S` after its start.
    """
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    host = socket.gethostname()
    marked = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = str(t.user_attrs.get("owner", ""))
        # A trial another tuner has only just asked has no owner or heartbeat yet: its start counts as
        # its first beat (marking it failed would pull it from under that tuner).
        started = t.datetime_start.timestamp() if t.datetime_start is not None else 0.0
        beat = float(t.user_attrs.get("heartbeat", started))
        o_host, _, o_pid = owner.rpartition(":")
        if o_host == host and o_pid.isdigit():
            gone = int(o_pid) != os.getpid() and not _pid_alive(int(o_pid))
            why = f"interrupted: tuner process {o_pid} ended during this trial"
        elif not owner:
            gone = now - started > OWNERLESS_AFTER_S
            why = f"interrupted: its tuner ended before recording itself ({now - started:.0f} s ago)"
        else:
            gone = now - beat > STALE_AFTER_S
            why = f"interrupted: no heartbeat from {owner} for {now - beat:.0f} s"
        if gone and mark_interrupted(study, t._trial_id, why):  # FrozenTrial's storage id (private)
            marked.append(t.number)
    return marked


def counts(study: Any) -> dict[str, int]:
    """Number of trials per state name (``COMPLETE``, ``FAIL``, ``PRUNED``, ``RUNNING``, ``WAITING``),
    interrupted ``FAIL`` trials counted apart as ``INTERRUPTED``."""
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        name = "INTERRUPTED" if is_interrupted(t) else t.state.name
        out[name] = out.get(name, 0) + 1
    return out


def finished(c: dict[str, int]) -> int:
    """Launched trials that ended: ``COMPLETE`` + ``FAIL`` (pruned ones never launched; interrupted ones
    run again)."""
    return c.get("COMPLETE", 0) + c.get("FAIL", 0)


def queued_points(study: Any) -> int:
    """Trials the study was given to run (enqueued: BSP forms, warm starts, seeds), in any state; the same
    number when a run resumes, so a resumed budget does not grow. A draw :func:`enqueue_untried` queued
    for the sampler is not one of them."""
    return sum(
        "fixed_params" in t.system_attrs and not t.user_attrs.get(FILLED)
        for t in study.get_trials(deepcopy=False)
    )


#: user attribute of a draw queued by :func:`enqueue_untried` in place of the sampler's repeats
FILLED = "filled"


#: a space of at most this many points (valid or not) is listed to find what is untried; a larger one is
#: drawn from, up to UNTRIED_DRAWS times
UNTRIED_LISTED = 4096
UNTRIED_DRAWS = 256


def draw_untried(
    study: Any, op: Op, space: SearchSpace, reach: float, rng: random.Random
) -> tuple[dict[str, Any] | None, bool]:
    """An untried valid point of ``space`` (flat params) of a variant not :func:`out_of_reach`, drawn at
    random: ``(point, False)``; ``(None, True)`` when none is left (the search is over); ``(None, False)``
    when none turned up in :data:`UNTRIED_DRAWS` draws of a space too large to list (an ``ag_gemm`` Iris
    variant has ~240k points: listing them takes seconds)."""
    from optuna.trial import TrialState

    states = (TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
    launched = {_point_id(t.params) for t in study.get_trials(deepcopy=False, states=states)}
    names = [n for n in space.names if out_of_reach(study, n, reach) is None]
    sizes = [math.prod(len(c) for c in space.params_of(n).values()) for n in names]

    def untried(name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        point = flat_params(name, params)
        if _point_id(point) in launched:
            return None
        return point if op.variants[name].check(space.key, space.target, params) is None else None

    if sum(sizes) <= UNTRIED_LISTED:
        points = [p for n in names for params in iter_grid(space.params_of(n)) if (p := untried(n, params))]
        return (rng.choice(points), False) if points else (None, True)
    for _ in range(UNTRIED_DRAWS):
        (name,) = rng.choices(names, weights=sizes)
        point = untried(name, {p: rng.choice(c) for p, c in space.params_of(name).items()})
        if point is not None:
            return point, False
    return None, False


def enqueue_untried(study: Any, point: dict[str, Any]) -> None:
    """Queue ``point`` (from :func:`draw_untried`) as the next draw: where the sampler keeps asking
    for what has run, is invalid or out of reach, each ask pruned, the budget goes to a new configuration
    instead. It counts as a sampler draw, not as a queued configuration (:func:`queued_points`)."""
    study.enqueue_trial(point, user_attrs={FILLED: True})


def _point_id(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted(params.items()))


def best_bsp(study: Any, space: SearchSpace) -> Any:
    """Fastest COMPLETE trial of any BSP form of ``space``: what every speedup is measured against."""
    found = [t for t in (best_trial(study, n) for n in space.forms or (space.baseline,)) if t is not None]
    return min(found, key=lambda t: t.value) if found else None


def fastest_form(study: Any, forms: list[str]) -> str | None:
    """The name of the fastest COMPLETE trial's variant among ``forms`` (the forms users have without
    autotaxer), or None when none of them completed."""
    found = [t for t in (best_trial(study, n) for n in forms) if t is not None]
    return min(found, key=lambda t: t.value).params["variant"] if found else None


def best_trial(study: Any, variant: str | None = None) -> Any:
    """Fastest COMPLETE trial (of ``variant`` when given), or None."""
    from optuna.trial import TrialState

    best = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if variant is not None and t.params.get("variant") != variant:
            continue
        if best is None or t.value < best.value:
            best = t
    return best


#: Complete trials a variant needs before :func:`out_of_reach` may judge it (its seeds, usually).
REACH_TRIALS = 2
#: ``--reach`` on GPUs (and warm-up's there): draws of a variant 25% behind at its best are not launched.
GPU_REACH = 1.25


def search_defaults(device_type: str) -> tuple[int, float]:
    """``--sampled`` and ``--reach`` where not given (the CLI's and warm-up's): 8 draws and
    :data:`GPU_REACH` on GPUs; 0 and 0 on CPU, where a trial compiles nothing and the tests count draws."""
    return (8, GPU_REACH) if device_type == "cuda" else (0, 0.0)


def is_queued(study: Any, trial: Any) -> bool:
    """Whether ``trial`` runs a configuration the study was given (BSP forms, warm starts, seeds), not a
    sampler draw."""
    return "fixed_params" in study._storage.get_trial_system_attrs(trial._trial_id)


def out_of_reach(study: Any, variant: str, reach: float) -> str | None:
    """Why a sampler draw of ``variant`` is not worth launching: its fastest of at least
    :data:`REACH_TRIALS` complete trials is ``reach`` times the key's fastest trial or slower; None
    otherwise, and always with ``reach`` 0 (off). A draw costs what a trial costs (a new configuration of
    a Triton variant compiles: ~1 s on 2xH200), and a variant whose seeds all trail by that much has not
    come back within 2% of the best on the keys measured (bench/results/2026-11-28_tune_layer_ws2_h200x2)."""
    from optuna.trial import TrialState

    if reach <= 0:
        return None
    mine = [
        t.value
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.params.get("variant") == variant
    ]
    best = best_trial(study)
    if len(mine) < REACH_TRIALS or best is None:
        return None
    ratio = min(mine) / best.value
    if ratio < reach:
        return None
    return (
        f"out of reach: {variant}'s fastest trial ({min(mine):.1f} µs) is {ratio:.2f}× the key's fastest "
        f"({best.value:.1f} µs), past --reach {reach:g}"
    )
