"""Autograd of ``ag_gemm``: ``C = all_gather(A_shard, gather_dim) @ B`` on every rank.

Forward runs the planned variant through :meth:`Plan.run_saving`, which also returns the gathered A it
communicated (a fresh tensor, saved for backward: no second all-gather). Backward, on every rank:

* ``grad_B = gathered_Aᵀ · grad_C`` (local: each rank's B is its own, e.g. a column shard of a weight);
* ``grad_A_shard = reduce-scatter(grad_C · Bᵀ + grad_gathered)`` along ``gather_dim``: every rank's
  gathered A is the same tensor, so its gradient is the sum over ranks, of which each keeps its shard.
  ``grad_gathered`` is the gradient of the gathered A where the caller used it too
  (:func:`autotaxer.fused_all_gather_matmul` returns it).

The reduce-scatter is NCCL's ``reduce_scatter_tensor`` (gloo: an all-reduce and the rank's slice), so a
backward captured in a CUDA graph replays like any NCCL collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def reduce_scatter_grad(full: torch.Tensor, gather_dim: int, group: Any, world_size: int) -> torch.Tensor:
    """This rank's shard of ``sum over ranks of full`` along ``gather_dim`` (``full`` is ``(M, K)``)."""
    if world_size == 1:
        return full
    import torch.distributed as dist

    m, k = full.shape
    if gather_dim == 0:
        stacked = full.contiguous()
        shard_shape = (m // world_size, k)
    else:  # the rank's K columns: make each rank's block contiguous first
        stacked = full.view(m, world_size, k // world_size).permute(1, 0, 2).contiguous()
        shard_shape = (m, k // world_size)
    if full.device.type == "cpu":  # gloo has no reduce_scatter: sum everywhere, keep this rank's block
        dist.all_reduce(stacked, group=group)
        rank = dist.get_rank(group)
        return stacked.view(world_size, *shard_shape)[rank].clone()
    out = torch.empty(shard_shape, dtype=full.dtype, device=full.device)
    dist.reduce_scatter_tensor(out, stacked, group=group)
    return out


def weight_grad(gathered: torch.Tensor, grad_out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gathered_Aᵀ · grad_C`` in B's own layout (row-major ``(N, K)`` transposed for an ``nk`` weight,
    so the weight's ``.grad`` comes out contiguous)."""
    if b.stride(0) == 1 and b.stride(1) != 1:
        return (grad_out.t() @ gathered).t()
    return gathered.t() @ grad_out


def ag_gemm_grads(
    needs: tuple[bool, ...],
    grad_out: torch.Tensor | None,
    grad_gathered: torch.Tensor | None,
    gathered: torch.Tensor,
    b: torch.Tensor,
    reduce_scatter: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_a_shard, grad_b)`` for the inputs in ``needs``: ``reduce_scatter(grad_C · Bᵀ +
    grad_gathered)`` and ``gathered_Aᵀ · grad_C``."""
    grad_a = grad_b = None
    if needs[0]:
        full = grad_out @ b.t() if grad_out is not None else None
        if grad_gathered is not None:
            full = grad_gathered if full is None else full + grad_gathered
        if full is not None:
            grad_a = reduce_scatter(full)
    if needs[1] and grad_out is not None:
        grad_b = weight_grad(gathered, grad_out, b)
    return grad_a, grad_b


class AgGemmFunction(torch.autograd.Function):
    """``(C, gathered A) = ag_gemm(a_shard, b)`` through a dispatch plan, differentiable in both inputs."""

    @staticmethod
    def forward(ctx: Any, a_shard: torch.Tensor, b: torch.Tensor, plan: Any) -> tuple[torch.Tensor, Any]:
        out, gathered = plan.run_saving((a_shard, b))
        ctx.save_for_backward(gathered, b)
        ctx.gather_dim = plan.key["gather_dim"]
        ctx.group = plan.ctx.group
        ctx.world_size = plan.ctx.world_size
        return out, gathered

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
        gathered, b = ctx.saved_tensors

        def reduce_scatter(full: torch.Tensor) -> torch.Tensor:
            return reduce_scatter_grad(full, ctx.gather_dim, ctx.group, ctx.world_size)

        needs = ctx.needs_input_grad[:2]
        return (*ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, reduce_scatter), None)
