"""Dispatch under ``torch.compile``: every op's custom ops registered, and what a traced call becomes.

Inside a compiled region :func:`autotaxer.dispatch` (and every function and layer built on it) becomes
one of two things, chosen while the graph is traced from the call's static sizes, strides and dtype (the
decision the first eager call of that shape would make, agreed by every rank):

* where dispatch serves the plain BSP form (``bsp``), the graph holds what plain PyTorch would: the
  functional collective (``all_gather_tensor`` / ``reduce_scatter_tensor``, differentiable) and the
  matmul, so inductor fuses, schedules and overlaps around them exactly as it does for ``F.linear``
  after a collective, and the compiled layer runs as fast as the compiled plain one;
* anywhere else (a fused variant, another BSP form, or sizes that are symbolic under dynamic shapes) the
  op's custom op, opaque to the compiler: its fake implementation gives the output's shape to the
  tracer, and at run time it is the ordinary eager dispatch (table lookup + the tuned variant).

A call needs what backward keeps (``ag_gemm``: the gathered A) where its caller uses it or where its
backward does (B requires grad); only then is a winner that cannot hand it out replaced, by the fastest
form that can (``Plan.saving``: where that is ``bsp``, the traced BSP), and the op's ``saving`` custom op
serves it. Calls of the custom ops are counted at run time (:func:`autotaxer.served`, path ``compiled``);
a BSP traced into the graph is not autotaxer's at run time: it is listed with its number of traces.

Each op has both forms in its ``compiled`` integration (:class:`autotaxer.ops._forms.CompiledForm`, found
by :func:`autotaxer.integrations.form`: ``autotaxer/integrations/<op>.py`` for the built-in ops, whose
custom ops are ``torch.ops.autotaxer.<op>...``); importing this module registers every op's. Process
groups cross the op boundary by name (:mod:`autotaxer.runtime._groups`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import ops_with
from ..runtime._groups import group_name, resolve
from ..runtime.dispatch import runtime_for
from . import form as find_form
from . import forms_of

__all__ = ["compiled_call", "compiled_dispatch", "compiled_saving"]


def _form(op: str) -> Any:
    """The ``compiled`` integration of ``op``; ``NotImplementedError`` naming those that have one."""
    found = find_form(op, "compiled")
    if found is None:
        names = sorted(o.name for o in ops_with("compiled"))
        raise NotImplementedError(f"dispatch({op!r}) inside torch.compile: custom ops exist for {names}")
    return found


#: The variant a compiled graph holds as plain PyTorch (functional collectives and the matmul).
PLAIN = "bsp"


@torch._dynamo.assume_constant_result
def _traced_variant(
    op: str, field: str, name: str, dim: int, a0: int, a1: int, as0: int, as1: int, b0: int, b1: int,
    bs0: int, bs1: int, dtype: torch.dtype, device: torch.device, keep: bool,
) -> str:  # fmt: skip
    """The variant dispatch serves a call of these static sizes, strides and dtype (``keep``: a call that
    needs what backward keeps); run while tracing (collective: every rank traces the same call)."""
    a = torch.empty_strided((a0, a1), (as0, as1), dtype=dtype, device="meta")
    b = torch.empty_strided((b0, b1), (bs0, bs1), dtype=dtype, device="meta")
    rt = runtime_for(resolve(name))
    variant = rt.decide_call(op, (a, b), {field: dim}, device, keep).variant
    if variant == PLAIN:
        rt.note_traced(op, (a, b), {field: dim}, variant)
    return variant


def _served_as_bsp(
    op: str, field: str, a: torch.Tensor, b: torch.Tensor, dim: int, name: str, keep: bool = False
) -> bool:
    """True when dispatch serves ``bsp`` for this call and its sizes are static (decided while tracing)."""
    from torch.fx.experimental.symbolic_shapes import has_static_value

    dims = (*a.shape, *a.stride(), *b.shape, *b.stride())
    if not all(has_static_value(d) for d in dims):
        return False  # dynamic shapes: the custom op decides per call at run time
    return _traced_variant(op, field, name, dim, *dims[:4], *dims[4:], a.dtype, a.device, keep) == PLAIN


def compiled_call(
    op: str, a: torch.Tensor, b: torch.Tensor, dim: int, group: Any, keep: bool = False
) -> tuple[Any, Any]:
    """``(output, saved or None)`` of a call of ``op`` while ``torch.compile`` traces: the traced BSP, or
    the op's custom op. ``keep``: the caller uses what backward keeps (returned as ``saved``); it is also
    kept where the call's backward needs it (``CompiledForm.backward_keeps``), else the winner serves
    whatever it can hand out."""
    form, name = _form(op), group_name(group)
    grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
    save = keep or (grad and form.backward_keeps(a, b))
    if save and form.saving is None:
        if keep:
            raise NotImplementedError(f"{op}: no custom op returns what its backward keeps")
        save = False
    if _served_as_bsp(op, form.field, a, b, dim, name, save):
        return form.plain(a, b, dim, name)
    if save:
        return form.saving(a, b, dim, name)
    return form.opaque(a, b, dim, name), None


def compiled_saving(op: str, a: torch.Tensor, b: torch.Tensor, dim: int, group: Any) -> tuple[Any, Any]:
    """``(output, saved)`` of a call of ``op`` while ``torch.compile`` traces (:func:`compiled_call`)."""
    return compiled_call(op, a, b, dim, group, keep=True)


def compiled_dispatch(op: str, tensors: tuple, out: Any, layout: dict[str, int], group: Any) -> Any:
    """What :func:`autotaxer.dispatch` does while ``torch.compile`` traces (see the module docstring)."""
    form = _form(op)
    for key in layout:
        if key != form.field:
            raise ValueError(f"{key}: not a layout field of {op} (known: {form.field})")
    a, b = tensors
    dim = int(layout.get(form.field, 0))
    grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    if grad and out is not None:
        raise RuntimeError("dispatch(out=...): an output buffer cannot be differentiated through")
    result = compiled_call(op, a, b, dim, group)[0]
    if out is not None:
        out.copy_(result)
        return out
    return result


# every op's custom ops registered now, as every compiled graph may call them (last: their modules import
# this one's functions lazily)
forms_of("compiled")
