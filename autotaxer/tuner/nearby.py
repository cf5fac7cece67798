"""Start close: a new key's search begins with the winners of the nearest tuned keys of the same op.

The tuned configurations nearest to a key are queued right after its BSP forms (as ``--warm-start``
records are), so a short budget measures first what won next door instead of what the sampler draws.
Nearest means, in order: the same GPU model and world size (other shapes), then the same GPU model at
other world sizes, then other GPU models; within each, the same dtype and layout first, then the smallest
shape distance ``sum |ln(size / size_tuned)|``. A configuration that is no point of the key's space (a
variant not searched here, a tiling its check refuses at this shape) is passed over, as are the forms
users have without autotaxer (queued anyway) and repeats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from .._problem import ProblemKey
from ..ops._base import Op
from .study import SearchSpace, point_of

#: Configurations queued per key by default: a few, so a short budget still reaches the sampler.
DEFAULT_LIMIT = 3


def shape_distance(a: ProblemKey, b: ProblemKey) -> float:
    """``sum |ln(size_a / size_b)|`` over the shape fields (inf when the fields differ)."""
    if [n for n, _ in a.shape] != [n for n, _ in b.shape]:
        return math.inf
    pairs = list(zip(a.shape, b.shape, strict=True))
    if any(va <= 0 or vb <= 0 for (_, va), (_, vb) in pairs):
        return math.inf
    return sum(abs(math.log(va / vb)) for (_, va), (_, vb) in pairs)


def nearness(key: ProblemKey, other: ProblemKey) -> tuple:
    """Sort key of ``other`` as a neighbour of ``key`` (smaller is nearer; see the module docstring)."""
    if other.gpu_model == key.gpu_model and other.world_size == key.world_size:
        tier = 0
    elif other.gpu_model == key.gpu_model:
        tier = 1
    else:
        tier = 2
    return (
        tier,
        other.dtype != key.dtype,
        other.layout != key.layout,
        shape_distance(key, other),
        abs(other.world_size - key.world_size),
        other.text,
    )


def nearby_configs(
    key: ProblemKey, records: Iterable[Any], op: Op, space: SearchSpace, limit: int = DEFAULT_LIMIT
) -> list[tuple[str, dict[str, Any]]]:
    """Up to ``limit`` ``(variant, params)`` of the records nearest to ``key`` that are points of ``space``,
    nearest first (records of other ops, and forms users have without autotaxer, are passed over)."""
    forms = set(op.fallback_forms())
    ranked = sorted(
        (r for r in records if r.key.op == key.op and r.variant not in forms),
        key=lambda r: nearness(key, r.key),
    )
    out: list[tuple[str, dict[str, Any]]] = []
    seen: list[dict[str, Any]] = []
    for rec in ranked:
        if len(out) >= limit:
            break
        point = point_of(op, space, rec.variant, rec.params)
        if point is None or point in seen:
            continue
        seen.append(point)
        out.append((rec.variant, dict(op.variants[rec.variant].complete_params(rec.params))))
    return out
