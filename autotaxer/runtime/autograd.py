"""Autograd of dispatch: a call whose input requires grad runs through its op's autograd function.

Each op declares how it is differentiated in its ``autograd`` integration
(:class:`autotaxer.ops._forms.AutogradForm`, ``autotaxer/ops/<op>/_autograd.py``): the forward runs the
planned variant and keeps what backward needs (``Variant.run_for_backward``: for an all-gather GEMM the
gathered input it communicated, so backward never communicates it again) only where backward needs it;
elsewhere the winner runs whatever it can hand out.
"""

from __future__ import annotations

from typing import Any


def autograd_form(op: Any) -> Any:
    """The ``autograd`` integration of ``op`` (an :class:`~autotaxer.ops.Op`), or None."""
    return op.integration("autograd")


def _form_of(plan: Any) -> Any:
    form = plan.autograd
    if form is None:
        from ..ops import ops_with

        names = sorted(o.name for o in ops_with("autograd"))
        raise NotImplementedError(f"dispatch({plan.key.op!r}): autograd is implemented for {names}")
    return form


def differentiable_call(plan: Any, tensors: tuple, out: Any) -> Any:
    """A differentiable call of :func:`~autotaxer.dispatch` through ``plan`` (path ``dispatch``): the
    winner serves it unless its backward needs what the winner cannot hand out."""
    form = _form_of(plan)
    if out is not None:
        raise RuntimeError(
            "dispatch(out=...): an output buffer cannot be differentiated through (in-place into a "
            "tensor autograd does not track); call without out= when an input requires grad"
        )
    return form.call(tensors, plan, "dispatch", False)[0]


def autograd_call(plan: Any, tensors: tuple, path: str, keep: bool) -> tuple[Any, Any]:
    """``(output, saved or None)`` through ``plan``, differentiable in both (``Runtime.serve``): ``keep``
    returns what backward keeps to the caller."""
    return _form_of(plan).call(tensors, plan, path, keep)
