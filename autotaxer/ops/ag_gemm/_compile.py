"""``ag_gemm`` under ``torch.compile``: its custom ops and its BSP as plain PyTorch writes it.

    torch.ops.autotaxer.ag_gemm(a_shard, b, gather_dim, group_name) -> Tensor (M, N)
    torch.ops.autotaxer.ag_gemm_saving(a_shard, b, gather_dim, group_name) -> (C, gathered A)

``ag_gemm`` is served by the key's winner whatever it can hand out; ``ag_gemm_saving`` is what a compiled
region calls where the gathered A is needed (returned to the caller, or B requires grad). Both have
autograd registrations whose reduce-scatter is a functional collective (traced, so inductor overlaps it
with the weight gradient as it does for plain PyTorch), so ``torch.compile`` traces forward and backward
around the opaque communicating forward. :mod:`autotaxer.runtime.custom_op` decides which form a call
gets.
"""

from __future__ import annotations

from typing import Any

import torch

from ...runtime._groups import collective_name, functional_collective, resolve, world_size
from ...runtime._runtimes import runtime_for
from .._forms import CompiledForm
from .._library import define
from .._matmul import linear_product
from ._autograd import ag_gemm_grads


def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    """All-gather ``a_shard`` along ``gather_dim`` over the group, then multiply by ``b`` (tuned variant)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return rt.serve("compiled", "ag_gemm", (a_shard, b), {"gather_dim": gather_dim})[0]


def _gathered_shape(a_shard: torch.Tensor, gather_dim: int, group_name: str) -> tuple[int, int]:
    ws = world_size(group_name)
    if gather_dim == 0:
        return a_shard.shape[0] * ws, a_shard.shape[1]
    return a_shard.shape[0], a_shard.shape[1] * ws


def _ag_gemm_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    m, _ = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1]))


def ag_gemm_saving(
    a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C, gathered A)``: :func:`ag_gemm` that also returns the gathered A it communicated (fresh)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return rt.serve("compiled", "ag_gemm", (a_shard, b), {"gather_dim": gather_dim}, keep=True)


def _ag_gemm_saving_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str):
    m, k = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1])), a_shard.new_empty((m, k))


_SCHEMA = "(Tensor a_shard, Tensor b, int gather_dim, str group_name)"
define("ag_gemm", f"{_SCHEMA} -> Tensor", ag_gemm, _ag_gemm_fake)
define("ag_gemm_saving", f"{_SCHEMA} -> (Tensor, Tensor)", ag_gemm_saving, _ag_gemm_saving_fake)


def _saving_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    a_shard, b, gather_dim, group_name = inputs
    ctx.save_for_backward(output[1], b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _reduce_scatter(ctx: Any) -> Any:
    """``full -> (this rank's shard of the sum over ranks, None)`` as a functional collective."""

    def reduce_scatter(full: torch.Tensor) -> tuple[torch.Tensor, None]:
        if world_size(ctx.group_name) == 1:
            return full, None
        group = collective_name(ctx.group_name)
        return functional_collective("reduce_scatter")(full.contiguous(), "sum", ctx.gather_dim, group), None

    return reduce_scatter


def _saving_backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
    gathered, b = ctx.saved_tensors
    needs = ctx.needs_input_grad[:2]
    return (*ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, _reduce_scatter(ctx)), None, None)


torch.library.register_autograd("autotaxer::ag_gemm_saving", _saving_backward, setup_context=_saving_setup)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a_shard, b, gather_dim, group_name = inputs
    # compiled code calls ag_gemm_saving where B requires grad; a direct call keeps the shard to gather again
    ctx.save_for_backward(a_shard if ctx.needs_input_grad[1] else None, b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _backward(ctx: Any, grad_out: torch.Tensor | None):
    """A's gradient needs only B; B's (a direct call of the op) the shard gathered again."""
    a_shard, b = ctx.saved_tensors
    gathered = _plain(a_shard, b, ctx.gather_dim, ctx.group_name)[1] if a_shard is not None else None
    needs = ctx.needs_input_grad[:2]
    return (*ag_gemm_grads(needs, grad_out, None, gathered, b, _reduce_scatter(ctx)), None, None)


torch.library.register_autograd("autotaxer::ag_gemm", _backward, setup_context=_setup)


def _plain(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """BSP as plain PyTorch writes it, traceable and differentiable: ``(C, gathered A)``."""
    gathered = functional_collective("all_gather")(a.contiguous(), dim, collective_name(name))
    return linear_product(gathered, b), gathered


def _opaque(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    return torch.ops.autotaxer.ag_gemm(a, b, dim, name)


def _backward_keeps(a: torch.Tensor, b: torch.Tensor) -> bool:
    return b.requires_grad  # grad_B = gathered Aᵀ · grad_C; grad_A needs only B


def _saving(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.autotaxer.ag_gemm_saving(a, b, dim, name)


FORM = CompiledForm(
    field="gather_dim", plain=_plain, opaque=_opaque, saving=_saving, backward_keeps=_backward_keeps
)
