"""Autograd of ``gemm_rs``: ``C_r = reduce-scatter(a · b)`` on every rank.

Forward runs the winner whatever it can hand out: backward needs only the inputs. Backward all-gathers
``grad_C`` and multiplies it by ``bᵀ`` in one tuned all-gather GEMM, which also returns the gathered
``grad_C`` where ``b`` requires grad (then ``grad_b = aᵀ · gathered grad_C``); else that GEMM's winner
serves whatever it can hand out.
"""

from __future__ import annotations

from typing import Any

import torch

from ...runtime._runtimes import runtime_for
from .._forms import AutogradForm
from .._matmul import weight_grad

#: The op that computes this op's input gradient (``all_gather(grad_C) · Bᵀ``, keeping the gathered one).
BACKWARD_OP = "ag_gemm"


class GemmRsFunction(torch.autograd.Function):
    """``C_r = reduce-scatter(a · b)`` through a dispatch plan, differentiable in both inputs."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, plan: Any, path: str) -> torch.Tensor:
        out, _ = plan.forward((a, b), path, False)
        ctx.save_for_backward(a, b)
        ctx.scatter_dim = plan.key["scatter_dim"]
        ctx.group = plan.ctx.group
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        a, b = ctx.saved_tensors
        rt = runtime_for(ctx.group)
        keep = ctx.needs_input_grad[1]  # the gathered grad_out, for b's gradient only
        layout = {"gather_dim": ctx.scatter_dim}
        grad_a, gathered = rt.serve("backward", BACKWARD_OP, (grad_out.contiguous(), b.t()), layout, keep)
        grad_b = weight_grad(a, gathered, b) if keep else None
        return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None


def _call(tensors: tuple, plan: Any, path: str, keep: bool) -> tuple[torch.Tensor, None]:
    """Backward keeps nothing the forward communicated: ``saved`` is None, ``keep`` or not."""
    return GemmRsFunction.apply(*tensors, plan, path), None


FORM = AutogradForm(call=_call)
