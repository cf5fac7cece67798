"""Autograd of dispatch: a call whose input requires grad runs through its op's autograd function.

Each op declares how it is differentiated in its ``autograd`` integration
(:class:`autotaxer.ops._forms.AutogradForm`, ``autotaxer/ops/<op>/_autograd.py``): the forward runs the
planned variant and keeps what backward needs (``Variant.run_for_backward``: for an all-gather GEMM the
gathered input it communicated, so backward never communicates it again).
"""

from __future__ import annotations

from typing import Any


def autograd_form(op: Any) -> Any:
    """The ``autograd`` integration of ``op`` (an :class:`~autotaxer.ops.Op`), or None."""
    return op.integration("autograd")


def differentiable_call(plan: Any, tensors: tuple, out: Any) -> Any:
    """A differentiable call through ``plan``: the forward keeps what backward needs."""
    form = plan.autograd
    if form is None:
        from ..ops import ops_with

        names = sorted(o.name for o in ops_with("autograd"))
        raise NotImplementedError(f"dispatch({plan.key.op!r}): autograd is implemented for {names}")
    if out is not None:
        raise RuntimeError(
            "dispatch(out=...): an output buffer cannot be differentiated through (in-place into a "
            "tensor autograd does not track); call without out= when an input requires grad"
        )
    return form.call(tensors, plan)


def saving_call(op: str, plan: Any, tensors: tuple) -> tuple[Any, Any]:
    """``(output, saved)`` through ``plan``, both differentiable (``dispatch_saving``)."""
    form = plan.autograd
    if form is None or form.saving is None:
        from ..ops import ops_with

        names = sorted(o.name for o in ops_with("autograd") if o.integration("autograd").saving)
        raise NotImplementedError(f"dispatch_saving({op!r}): implemented for {names}")
    return form.saving(tensors, plan)
