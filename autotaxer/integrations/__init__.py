"""What serves the ops beyond dispatch and tuning: one layer above the ops and the runtime.

An op declares the integrations it takes part in as data (``Op.integrations``, kinds of
:data:`autotaxer.ops._forms.INTEGRATION_KINDS`); this layer holds their forms and finds them here:
``compiled`` (its custom ops and traced BSP under ``torch.compile``, :mod:`.compiled`), ``autograd``
(:mod:`.autograd`), ``functions`` (of :mod:`autotaxer.functional`), ``bench`` (a bench row's parts and
peers) and ``emulated`` (checks on ranks emulated in one process). :mod:`.dispatch` decides which path a
call takes (under ``torch.compile``, differentiable, the runtime's hot path).

The built-in ops' forms are modules of this package, one an op (:data:`MODULES`; each exposes ``FORMS``:
kind -> form), imported on first use. An op outside the package, and any form that needs nothing above
the ops (the emulated checks, a plugin's bench parts), is carried by the op itself (``Op.forms``).
Dependencies run one way down: this layer -> the runtime -> the ops.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..ops import Op, get_op, ops_with

#: Op name -> the module of this package holding the forms of the integrations it declares.
MODULES: dict[str, str] = {
    "ag_gemm": f"{__name__}.ag_gemm",
    "gemm_rs": f"{__name__}.gemm_rs",
}

_FORMS: dict[tuple[str, str], tuple[Op, Any]] = {}  # (op name, kind) -> (that op, its form), once found


def form(op: Op | str, kind: str) -> Any:
    """The form of integration ``kind`` of ``op`` (an op or its registered name), or None when the op
    does not take part in it; ``LookupError`` naming both when it declares ``kind`` but no form is found."""
    if isinstance(op, str):
        op = get_op(op)
    cached = _FORMS.get((op.name, kind))
    if cached is not None and cached[0] is op:
        return cached[1]
    if kind not in op.integrations:
        return None
    found = op.forms.get(kind)
    if found is None and op.name in MODULES:
        found = importlib.import_module(MODULES[op.name]).FORMS.get(kind)
    if found is None:
        raise LookupError(f"{op.name}: declares integration {kind!r}, but no form of it is found")
    _FORMS[(op.name, kind)] = (op, found)
    return found


def forms_of(kind: str) -> dict[str, Any]:
    """Op name -> its form of integration ``kind``, for every registered op taking part in it."""
    return {op.name: form(op, kind) for op in ops_with(kind)}


__all__ = ["MODULES", "form", "forms_of"]
