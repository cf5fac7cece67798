"""Pure table lookup: a problem key and a table of winners in, one decision out.

Policy (the same on every rank, because it depends only on the table, the key and the target):

1. **exact**: the table has a record for the key, its variant runs on this target and its parameters
   pass the variant's ``check`` for the key;
2. **nearest**: otherwise the record whose key differs only in the op's first shape field (``M`` for
   ``ag_gemm``) with the smallest log distance ``|ln(M / M_tuned)|`` within ``max_log_distance``, whose
   configuration is valid for the requested shape (ties: the larger tuned M, then the text of its key)
   and whose winner beat the baseline there by at least ``min_nearest_speedup`` (a configuration that
   only just won at its own M is as likely to lose at another: measured on 2xH200, a push tiling tuned
   at M=256 (1.02x) ran 0.88x at M=128), and whose variant is not in the op's ``tied_to_size`` (ag_gemm:
   the Triton GEMM variants, whose tilings are chosen for the tuned M's tile waves: M=256's push at
   M=128 ran 0.75x on 4xH200 even after winning 1.19x at M=256);
3. **fallback**: otherwise the fastest form users have without autotaxer (a BSP form, or torch's fused
   op: the op's ``fallback_forms``) as measured at the nearest tuned key of the same GPU, world size,
   dtype, op and layout (smallest ``sum |ln(size / size_tuned)|`` over the shape fields, within
   ``max_log_distance``: forms rank differently far apart; on 2xH200 torch's fused op, the fastest form
   at M=4096, served at M=256 made the layer's forward 1.3x slower), as the record says (its
   ``env["fastest_form"]``, stamped by the tuner, or its winner when that is such a form), when that
   form runs here; else the op's baseline (BSP) with its default parameters. A miss is never an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._problem import ProblemKey, Target
from ..records import FASTEST_FORM

#: Sources of a decision.
EXACT, NEAREST, FALLBACK = "exact", "nearest", "fallback"

#: Default bound on the nearest-M search: tuned M within a factor of 2 of the requested M.
DEFAULT_MAX_LOG_DISTANCE = math.log(2.0)
#: Default margin a neighbour's winner must have had over the baseline to be reused at another M.
DEFAULT_MIN_NEAREST_SPEEDUP = 1.1


@dataclass(frozen=True)
class Decision:
    """What dispatch runs for one problem key."""

    variant: str
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = FALLBACK
    distance: float = 0.0
    tuned_key: ProblemKey | None = None  # the record the decision came from (None for fallback)

    @property
    def digest(self) -> str:
        """Canonical text of the decision; equal on every rank that decided the same."""
        return json.dumps([self.variant, dict(self.params), self.source], sort_keys=True, default=str)

    @property
    def is_miss(self) -> bool:
        return self.source != EXACT


def nearest_field(op: Any) -> str | None:
    """The shape field searched by distance: the op's first shape field (``M``; ``B`` for decode)."""
    fields = tuple(getattr(op, "shape_fields", ()))
    return fields[0] if fields else None


def _usable(op: Any, target: Target, key: ProblemKey, variant: str, params: Mapping[str, Any]) -> bool:
    v = op.available_variants(target).get(variant)
    return v is not None and v.check(key, target, params) is None


def _same_except(a: ProblemKey, b: ProblemKey, name: str) -> bool:
    if (a.op, a.gpu_model, a.world_size, a.dtype, a.layout) != (
        b.op,
        b.gpu_model,
        b.world_size,
        b.dtype,
        b.layout,
    ):
        return False
    if [k for k, _ in a.shape] != [k for k, _ in b.shape]:
        return False
    return all(va == vb for (ka, va), (_, vb) in zip(a.shape, b.shape, strict=True) if ka != name)


def nearest_candidates(
    records: Iterable[Any], key: ProblemKey, name: str, max_log_distance: float
) -> list[tuple[float, Any]]:
    """Records that differ from ``key`` only in shape field ``name``, within the bound, best first."""
    want = key.get(name)
    if want is None or want <= 0:
        return []
    found = []
    for rec in records:
        if rec.key == key or not _same_except(rec.key, key, name):
            continue
        have = rec.key[name]
        if have <= 0:
            continue
        dist = abs(math.log(want / have))
        if dist <= max_log_distance + 1e-12:
            found.append((dist, -have, rec.key.text, rec))
    found.sort(key=lambda t: t[:3])
    return [(d, rec) for d, _, _, rec in found]


def decide(
    table: Mapping[ProblemKey, Any],
    key: ProblemKey,
    op: Any,
    target: Target,
    max_log_distance: float = DEFAULT_MAX_LOG_DISTANCE,
    min_nearest_speedup: float = DEFAULT_MIN_NEAREST_SPEEDUP,
) -> Decision:
    """Choose the variant and parameters for ``key`` (see the module docstring for the policy).

    ``table`` maps problem keys to records with ``variant`` and ``params`` (``WinnerRecord``).
    """
    rec = table.get(key)
    if rec is not None and _usable(op, target, key, rec.variant, rec.params):
        return Decision(rec.variant, dict(rec.params), EXACT, 0.0, rec.key)
    name = nearest_field(op)
    if name is not None:
        for dist, cand in nearest_candidates(table.values(), key, name, max_log_distance):
            if cand.variant in op.tied_to_size or cand.speedup < min_nearest_speedup:
                continue
            if _usable(op, target, key, cand.variant, cand.params):
                return Decision(cand.variant, dict(cand.params), NEAREST, dist, cand.key)
    form = fastest_form_near(table.values(), key, op, target, max_log_distance)
    if form is not None:
        return form
    base = op.baseline()
    return Decision(base.name, base.default_params(key, target), FALLBACK, math.inf, None)


def fastest_form(record: Any, op: Any) -> str | None:
    """The fastest form without autotaxer measured for ``record``'s key (``env["fastest_form"]``, else its
    winner when that is such a form), or None when the record does not say."""
    stamped = (record.env or {}).get(FASTEST_FORM)
    if stamped:
        return str(stamped)
    return record.variant if record.variant in op.fallback_forms() else None


def _shape_distance(a: ProblemKey, b: ProblemKey) -> float:
    return sum(abs(math.log(va / vb)) for (_, va), (_, vb) in zip(a.shape, b.shape, strict=True))


def fastest_form_near(
    records: Iterable[Any],
    key: ProblemKey,
    op: Any,
    target: Target,
    max_log_distance: float = DEFAULT_MAX_LOG_DISTANCE,
    accept: Callable[[Any], bool] = lambda variant: True,
) -> Decision | None:
    """The :data:`FALLBACK` decision of the fastest form measured at the nearest tuned key of the same GPU,
    world size, dtype, op and layout (within ``max_log_distance`` summed over the shape fields) whose
    form runs here (default parameters) and which ``accept(variant)`` takes, or None."""
    near = []
    for rec in records:
        k = rec.key
        if (k.op, k.gpu_model, k.world_size, k.dtype, k.layout) != (
            key.op, key.gpu_model, key.world_size, key.dtype, key.layout
        ):  # fmt: skip
            continue
        if [f for f, _ in k.shape] != [f for f, _ in key.shape] or min(v for _, v in k.shape) <= 0:
            continue
        dist = _shape_distance(k, key)
        if dist <= max_log_distance + 1e-12:
            near.append((dist, k.text, rec))
    for dist, _, rec in sorted(near, key=lambda t: t[:2]):
        name = fastest_form(rec, op)
        variant = op.available_variants(target).get(name) if name else None
        if variant is None or not accept(variant):
            continue
        try:
            params = variant.default_params(key, target)
        except ValueError:
            continue
        return Decision(name, params, FALLBACK, dist, rec.key)
    return None


def _saves(variant: Any) -> bool:
    return variant.saves_for_backward()


def saving_decision(
    table: Mapping[ProblemKey, Any],
    key: ProblemKey,
    decision: Decision,
    op: Any,
    target: Target,
    max_log_distance: float = DEFAULT_MAX_LOG_DISTANCE,
) -> Decision:
    """What serves the calls of ``key`` that need what its backward keeps (``ag_gemm``: the gathered A,
    returned to the caller or saved for the weight's gradient): ``decision`` itself when its variant hands
    that out (:meth:`~autotaxer.ops.Variant.saves_for_backward`), else the fastest form that does as the
    table knows it: the fastest form measured at the decision's tuned key (``fastest_form``), else at the
    nearest tuned key (:func:`fastest_form_near`), else the op's baseline (BSP). Pure and the same on every
    rank, like :func:`decide`."""
    variant = op.variants.get(decision.variant)
    if variant is not None and variant.saves_for_backward():
        return decision
    rec = table.get(decision.tuned_key) if decision.tuned_key is not None else None
    name = fastest_form(rec, op) if rec is not None else None
    form = op.available_variants(target).get(name) if name else None
    if form is not None and _saves(form):
        try:
            return Decision(name, form.default_params(key, target), FALLBACK, decision.distance, rec.key)
        except ValueError:
            pass
    near = fastest_form_near(table.values(), key, op, target, max_log_distance, accept=_saves)
    if near is not None:
        return near
    base = op.baseline()
    return Decision(base.name, base.default_params(key, target), FALLBACK, math.inf, None)
