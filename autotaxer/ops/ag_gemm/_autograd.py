"""Autograd of ``ag_gemm``: ``C = all_gather(A_shard, gather_dim) @ B`` on every rank.

Forward runs the planned variant. Where B requires grad (or the caller wants the gathered A) it runs
through :meth:`Plan.run_saving`, which also returns the gathered A it communicated (a fresh tensor, saved
for backward: no second all-gather; a winner that cannot hand it out is replaced, for that call, by the
fastest form that can); elsewhere the winner runs whatever it can save, since A's gradient needs only B.
Backward, on every rank:

* ``grad_B = gathered_Aᵀ · grad_C`` (local: each rank's B is its own, e.g. a column shard of a weight);
* ``grad_A_shard = reduce-scatter(grad_C · Bᵀ + grad_gathered)`` along ``gather_dim``: every rank's
  gathered A is the same tensor, so its gradient is the sum over ranks, of which each keeps its shard.
  ``grad_gathered`` is the gradient of the gathered A where the caller used it too
  (:func:`autotaxer.fused_all_gather_matmul` returns it). Where a tuned ``gemm_rs`` (the reduce-scatter
  op) serves ``grad_C · Bᵀ``, it computes and scatters in one.

The reduce-scatter is NCCL's ``reduce_scatter_tensor`` (gloo: an all-reduce and the rank's slice), so a
backward captured in a CUDA graph replays like any NCCL collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...runtime._runtimes import runtime_for
from .._collectives import reduce_scatter_async
from .._forms import AutogradForm
from .._matmul import weight_grad

#: The op that computes this op's input gradient (``grad_C · Bᵀ``, reduce-scattered).
BACKWARD_OP = "gemm_rs"


def reduce_scatter_grad_async(
    full: torch.Tensor, gather_dim: int, group: Any, world_size: int
) -> tuple[torch.Tensor, Any]:
    """This rank's shard of ``sum over ranks of full`` along ``gather_dim`` (``full`` is ``(M, K)``),
    issued without waiting: ``(shard, work)``; ``work.wait()`` (when not None) before the shard is used,
    so what is queued in between overlaps the collective."""
    if world_size == 1:
        return full, None
    m, k = full.shape
    shape = (m // world_size, k) if gather_dim == 0 else (m, k // world_size)
    return reduce_scatter_async(full, full.new_empty(shape), gather_dim, group)


def ag_gemm_grads(
    needs: tuple[bool, ...],
    grad_out: torch.Tensor | None,
    grad_gathered: torch.Tensor | None,
    gathered: torch.Tensor,
    b: torch.Tensor,
    reduce_scatter: Callable[[torch.Tensor], tuple[torch.Tensor, Any]],
    gemm_rs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_a_shard, grad_b)`` for the inputs in ``needs``: ``reduce_scatter(grad_C · Bᵀ +
    grad_gathered)`` and ``gathered_Aᵀ · grad_C``. ``gemm_rs(grad_C, Bᵀ)`` (a tuned op that computes and
    scatters in one) returns the first, or None where plain BSP serves it; then the product is computed
    here and ``reduce_scatter`` (returning ``(shard, work or None)``) scatters it while ``grad_b`` is
    computed, as PyTorch's functional collectives let autograd do for plain layers."""
    grad_a = grad_b = work = None
    if needs[0] and gemm_rs is not None and grad_gathered is None and grad_out is not None:
        grad_a = gemm_rs(grad_out, b.t())
    if needs[0] and grad_a is None:
        full = grad_out @ b.t() if grad_out is not None else None
        if grad_gathered is not None:
            full = grad_gathered if full is None else full + grad_gathered
        if full is not None:
            grad_a, work = reduce_scatter(full)
    if needs[1] and grad_out is not None:
        grad_b = weight_grad(gathered, grad_out, b)
    if work is not None:
        work.wait()
    return grad_a, grad_b


class AgGemmFunction(torch.autograd.Function):
    """``(C, gathered A) = ag_gemm(a_shard, b)`` through a dispatch plan, differentiable in both inputs."""

    @staticmethod
    def forward(
        ctx: Any, a_shard: torch.Tensor, b: torch.Tensor, plan: Any, path: str, keep: bool
    ) -> tuple[torch.Tensor, Any]:
        weight_grad_needed = ctx.needs_input_grad[1]  # grad_B = gathered Aᵀ · grad_C; grad_A needs only B
        out, gathered = plan.forward((a_shard, b), path, keep or weight_grad_needed)
        ctx.save_for_backward(gathered if weight_grad_needed else None, b)
        ctx.set_materialize_grads(False)  # an unused gathered A has no gradient: no zeros to add
        ctx.gather_dim = plan.key["gather_dim"]
        ctx.group = plan.ctx.group
        ctx.world_size = plan.ctx.world_size
        return out, (gathered if keep else None)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
        gathered, b = ctx.saved_tensors

        def reduce_scatter(full: torch.Tensor) -> tuple[torch.Tensor, Any]:
            return reduce_scatter_grad_async(full, ctx.gather_dim, ctx.group, ctx.world_size)

        def gemm_rs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
            rt = runtime_for(ctx.group)
            x = x.contiguous()
            plan = rt.plan(BACKWARD_OP, x, y, scatter_dim=ctx.gather_dim)
            if plan.decision.variant == "bsp":
                plan.count("backward", "bsp")  # computed and scattered by ag_gemm_grads, overlapping grad_b
                return None
            return rt.serve("backward", BACKWARD_OP, (x, y), {"scatter_dim": ctx.gather_dim})[0]

        needs = ctx.needs_input_grad[:2]
        grads = ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, reduce_scatter, gemm_rs)
        return (*grads, None, None, None)


def _call(tensors: tuple, plan: Any, path: str, keep: bool) -> tuple[torch.Tensor, Any]:
    return AgGemmFunction.apply(*tensors, plan, path, keep)


FORM = AutogradForm(call=_call)
