"""Autograd of ``gemm_rs``: ``C_r = reduce-scatter(a · b)`` on every rank.

Backward all-gathers ``grad_C`` and multiplies it by ``bᵀ`` in one tuned all-gather GEMM (which also
returns the gathered ``grad_C``), then ``grad_b = aᵀ · gathered grad_C``.
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
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, plan: Any) -> torch.Tensor:
        out, _ = plan.run_saving((a, b))
        ctx.save_for_backward(a, b)
        ctx.scatter_dim = plan.key["scatter_dim"]
        ctx.group = plan.ctx.group
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        a, b = ctx.saved_tensors
        rt = runtime_for(ctx.group)
        grad_a, gathered = rt.dispatch_saving(
            BACKWARD_OP, grad_out.contiguous(), b.t(), gather_dim=ctx.scatter_dim
        )
        grad_b = weight_grad(a, gathered, b) if ctx.needs_input_grad[1] else None
        return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None


FORM = AutogradForm(call=lambda tensors, plan: GemmRsFunction.apply(*tensors, plan))
