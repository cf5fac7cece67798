"""``gemm_rs`` under ``torch.compile``: its custom op and its BSP as plain PyTorch writes it.

    torch.ops.autotaxer.gemm_rs(a, b, scatter_dim, group_name) -> Tensor (its slice of sum_r a_r b_r)

Its autograd registration runs the backward as one tuned all-gather GEMM (the backward op's ``saving``
custom op), which also returns the gathered ``grad_out`` for the weight's gradient.
:mod:`autotaxer.runtime.custom_op` decides which form a call gets.
"""

from __future__ import annotations

from typing import Any

import torch

from ...runtime._groups import collective_name, functional_collective, resolve, world_size
from ...runtime._runtimes import runtime_for
from .. import get_op
from .._forms import CompiledForm
from .._library import define
from .._matmul import linear_product, weight_grad
from ._autograd import BACKWARD_OP


def gemm_rs(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of the sum over ranks of ``a @ b`` (tuned variant)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return rt.serve("compiled", "gemm_rs", (a, b), {"scatter_dim": scatter_dim})[0]


def _gemm_rs_fake(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    ws = world_size(group_name)
    m, n = a.shape[0], b.shape[1]
    return a.new_empty((m // ws, n) if scatter_dim == 0 else (m, n // ws))


define("gemm_rs", "(Tensor a, Tensor b, int scatter_dim, str group_name) -> Tensor", gemm_rs, _gemm_rs_fake)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b, scatter_dim, group_name = inputs
    ctx.save_for_backward(a, b)
    ctx.scatter_dim, ctx.group_name = scatter_dim, group_name


def _backward(ctx: Any, grad_out: torch.Tensor):
    """One tuned all-gather GEMM of ``grad_out`` with ``bᵀ``; where ``b`` requires grad it also returns the
    gathered ``grad_out`` (else its winner serves whatever it can hand out)."""
    a, b = ctx.saved_tensors
    form = get_op(BACKWARD_OP).integration("compiled")
    args = (grad_out.contiguous(), b.t(), ctx.scatter_dim, ctx.group_name)
    if ctx.needs_input_grad[1]:
        grad_a, gathered = form.saving(*args)
        grad_b = weight_grad(a, gathered, b)
    else:
        grad_a, grad_b = form.opaque(*args), None
    return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None


torch.library.register_autograd("autotaxer::gemm_rs", _backward, setup_context=_setup)


def _plain(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, None]:
    """BSP as plain PyTorch writes it, traceable and differentiable: ``(C slice, None)``."""
    group = collective_name(name)
    return functional_collective("reduce_scatter")(linear_product(a, b), "sum", dim, group), None


def _opaque(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    return torch.ops.autotaxer.gemm_rs(a, b, dim, name)


FORM = CompiledForm(field="scatter_dim", plain=_plain, opaque=_opaque)
