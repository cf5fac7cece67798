"""Autograd of dispatch, and the routing of a call made by another path than the hot one.

A call whose input requires grad (under grad mode) runs through its op's ``autograd`` integration
(:class:`autotaxer.ops._forms.AutogradForm`, found by :func:`autotaxer.integrations.form`): the forward
runs the planned variant and keeps what backward needs (``Variant.run_for_backward``: for an all-gather
GEMM the gathered input it communicated, so backward never communicates it again) only where backward
needs it; elsewhere the winner runs whatever it can hand out. :func:`serve` is how the functions, the
custom ops, the backward passes and the async-TP override call an op.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import ops_with
from ..runtime.agreement import OutOfStepError, raise_if_peer_left
from . import form


def _form_of(plan: Any) -> Any:
    found = form(plan.opobj, "autograd") if plan.opobj is not None else None
    if found is None:
        names = sorted(o.name for o in ops_with("autograd"))
        raise NotImplementedError(f"dispatch({plan.key.op!r}): autograd is implemented for {names}")
    return found


def differentiable_call(plan: Any, tensors: tuple, out: Any) -> Any:
    """A differentiable call of :func:`~autotaxer.dispatch` through ``plan`` (path ``dispatch``): the
    winner serves it unless its backward needs what the winner cannot hand out."""
    found = _form_of(plan)
    if out is not None:
        raise RuntimeError(
            "dispatch(out=...): an output buffer cannot be differentiated through (in-place into a "
            "tensor autograd does not track); call without out= when an input requires grad"
        )
    return found.call(tensors, plan, "dispatch", False)[0]


def autograd_call(plan: Any, tensors: tuple, path: str, keep: bool) -> tuple[Any, Any]:
    """``(output, saved or None)`` through ``plan``, differentiable in both (:func:`serve`): ``keep``
    returns what backward keeps to the caller."""
    return _form_of(plan).call(tensors, plan, path, keep)


def serve(
    rt: Any, path: str, op: str, tensors: tuple, layout: dict[str, Any], keep: bool = False
) -> tuple[Any, Any]:
    """``(output, saved or None)`` of one call of ``op`` on runtime ``rt`` made by ``path`` (the name
    :func:`autotaxer.served` counts it under: ``function``, ``compiled``, ``backward``, ...).

    The key's winner serves it unless the call needs what backward keeps and the winner cannot hand
    that out; then the fastest form that can (``Plan.saving``). It is needed when ``keep`` (the caller
    uses it: ``saved`` is returned) or when the backward of a differentiable call does (``ag_gemm``:
    the gathered A, for B's gradient only). Differentiable when an input requires grad under grad
    mode. Collective, like :func:`autotaxer.dispatch`."""
    try:
        plan = rt.serving_plan(op, tensors, layout)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return autograd_call(plan, tensors, path, keep)
        return plan.forward(tensors, path, keep)
    except OutOfStepError:
        raise
    except Exception as exc:  # a peer that left out of step made this call fail: named here too
        raise_if_peer_left(rt.group, exc)
        raise
