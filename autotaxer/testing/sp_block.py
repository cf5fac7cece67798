"""A sequence-parallel MLP block in plain PyTorch, the pattern PyTorch's async TP rewrites.

``sp_block(x_shard, weights, group)``: RMSNorm of this rank's rows ``(seq/ws, batch, hidden)``, an
all-gather of the normed rows (functional collectives, differentiable), SwiGLU with this rank's column
shards of the gate and up projections (two matmuls sharing one all-gather), the down projection with this
rank's row shard, a reduce-scatter of the partial sums and the residual. Under ``torch.compile`` with
``torch._inductor.config._micro_pipeline_tp = True`` and symmetric memory enabled for the group, inductor
turns its forward and backward into ``symm_mem.fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter`` calls. :func:`reference_block` is the unsharded block, for checks on
upcast inputs. Used by the async-TP tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

NAMES = ("norm", "gate", "up", "down")


@dataclass(frozen=True)
class BlockShape:
    """Global sizes: ``seq`` rows (sharded over ranks), ``batch``, ``hidden``, ``ffn`` (sharded)."""

    seq: int
    batch: int
    hidden: int
    ffn: int

    def validate(self, world_size: int) -> None:
        """``ValueError`` naming the field that is not positive or not divisible by the world size."""
        for name in ("seq", "batch", "hidden", "ffn"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("seq", "ffn"):
            if getattr(self, name) % world_size:
                raise ValueError(f"{name}: {getattr(self, name)} is not divisible by world size {world_size}")


def full_weights(shape: BlockShape, seed: int, device: Any) -> dict[str, torch.Tensor]:
    """The unsharded fp32 weights (nn.Linear's ``(out, in)`` layout), the same on every rank."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, f = shape.hidden, shape.ffn

    def rand(*size: int, scale: float) -> torch.Tensor:
        return torch.randn(size, generator=g, device=device) * scale

    return {
        "norm": 1.0 + rand(h, scale=0.1),
        "gate": rand(f, h, scale=h**-0.5),
        "up": rand(f, h, scale=h**-0.5),
        "down": rand(h, f, scale=f**-0.5),
    }


def shard_weights(
    full: dict[str, torch.Tensor], rank: int, world_size: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """This rank's leaf parameters: gate and up row shards (column-parallel), down column shard
    (row-parallel), the norm weight whole."""
    shards = {
        "norm": full["norm"],
        "gate": full["gate"].chunk(world_size, 0)[rank],
        "up": full["up"].chunk(world_size, 0)[rank],
        "down": full["down"].chunk(world_size, 1)[rank],
    }
    return {k: v.to(dtype).contiguous().requires_grad_() for k, v in shards.items()}


def _mlp(x: torch.Tensor, w: dict[str, torch.Tensor], gather: Any, scatter: Any) -> torch.Tensor:
    h = gather(torch.nn.functional.rms_norm(x, (x.shape[-1],), w["norm"], eps=1e-6))
    a = torch.nn.functional.silu(torch.nn.functional.linear(h, w["gate"])) * torch.nn.functional.linear(
        h, w["up"]
    )
    return x + scatter(torch.nn.functional.linear(a, w["down"]))


def sp_block(x_shard: torch.Tensor, w: dict[str, torch.Tensor], group: Any) -> torch.Tensor:
    """The block on this rank's rows ``(seq/ws, batch, hidden)``; collective over ``group``."""
    import torch.distributed._functional_collectives as funcol

    return _mlp(
        x_shard,
        w,
        lambda t: funcol.all_gather_tensor_autograd(t, 0, group),
        lambda t: funcol.reduce_scatter_tensor_autograd(t, "sum", 0, group),
    )


def reference_block(x: torch.Tensor, full: dict[str, torch.Tensor]) -> torch.Tensor:
    """The unsharded block on all rows (the sum over ranks of every partial product, no communication)."""
    return _mlp(x, full, lambda t: t, lambda t: t)


def reference_step(
    shape: BlockShape,
    rank: int,
    world_size: int,
    device: Any,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One step of the unsharded block in ``dtype``: ``(full weights, x, loss weight, want)``, the loss
    ``sum(block(x) * loss weight)``; ``want`` holds this rank's share of the output (``out``) and of the
    gradients of ``x`` and of each weight in :data:`NAMES` (the norm weight's whole)."""
    full = {k: v.to(dtype).requires_grad_() for k, v in full_weights(shape, seed, device).items()}
    g = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(shape.seq, shape.batch, shape.hidden, generator=g, device=device).to(dtype)
    loss_weight = torch.randn(x.shape, generator=g, device=device).to(dtype)
    x.requires_grad_()
    out = reference_block(x, full)
    (out * loss_weight).sum().backward()
    ws = world_size
    want = {"norm": full["norm"].grad, "gate": full["gate"].grad.chunk(ws, 0)[rank]}
    want |= {"up": full["up"].grad.chunk(ws, 0)[rank], "down": full["down"].grad.chunk(ws, 1)[rank]}
    want |= {"x": x.grad.chunk(ws)[rank], "out": out.detach().chunk(ws)[rank]}
    return {k: v.detach() for k, v in full.items()}, x.detach(), loss_weight, want


def sharded_step(
    fn: Any, x: torch.Tensor, w: dict[str, torch.Tensor], loss_weight: torch.Tensor, group: Any
) -> dict[str, torch.Tensor]:
    """One step of ``fn(x, w)`` on this rank's rows (loss ``sum(out * loss_weight)``, in fp32): the output
    and the gradients, keyed as :func:`reference_step`'s ``want`` (the norm weight's summed over ranks)."""
    import torch.distributed as dist

    for t in (x, *w.values()):
        t.grad = None
    y = fn(x, w)
    (y.float() * loss_weight.float()).sum().backward()
    got = {k: w[k].grad.clone() for k in NAMES} | {"x": x.grad.clone(), "out": y.detach().clone()}
    dist.all_reduce(got["norm"], group=group)  # every rank's rows add to the norm weight's gradient
    return got
