"""The bulk-synchronous collectives the baselines are made of, and that several parts use besides them:
the backward passes, the process warm-up and the benchmark's "communication alone" (NCCL/RCCL on GPUs,
gloo on CPU)."""

from __future__ import annotations

from typing import Any

from ._base import RunContext


def all_gather_shards(shard: Any, gathered: Any, ctx: RunContext) -> None:
    """All-gather ``shard`` into ``gathered`` of shape ``(world_size, *shard.shape)`` (NCCL/RCCL or gloo)."""
    import torch.distributed as dist

    if ctx.world_size == 1:
        gathered[0].copy_(shard)
    elif ctx.target.device_type == "cpu":
        # gloo has no all_gather_into_tensor on every torch release; the list form works everywhere.
        dist.all_gather(list(gathered.unbind(0)), shard.contiguous(), group=ctx.group)
    else:
        dist.all_gather_into_tensor(gathered, shard.contiguous(), group=ctx.group)


def reduce_scatter(full: Any, out: Any, scatter_dim: int, group: Any = None) -> Any:
    """``out`` = this rank's slice along ``scatter_dim`` of the sum over ranks of ``full`` (2-D); NCCL's
    ``reduce_scatter_tensor``, or on CPU (gloo has none) an all-reduce and the rank's slice. The current
    stream waits for the collective: ``out`` is ready to read and ``full`` free to overwrite."""
    out, work = reduce_scatter_async(full, out, scatter_dim, group)
    if work is not None:
        work.wait()
    return out


def reduce_scatter_async(full: Any, out: Any, scatter_dim: int, group: Any = None) -> tuple[Any, Any]:
    """:func:`reduce_scatter` issued without waiting: ``(out, work)``, where ``work.wait()`` (when work is
    not None) makes the current stream wait for it, so work queued in between overlaps the collective."""
    import torch.distributed as dist

    ws = dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1
    if ws == 1:
        return out.copy_(full), None
    m, n = full.shape
    if scatter_dim == 0:
        stacked = full.contiguous()
    else:  # each rank's columns made contiguous, in rank order
        stacked = full.view(m, ws, n // ws).permute(1, 0, 2).contiguous()
    if full.device.type == "cpu":
        stacked = stacked.clone() if stacked is full else stacked  # all_reduce writes in place
        dist.all_reduce(stacked, group=group)
        return out.copy_(stacked.reshape(ws, *out.shape)[dist.get_rank(group)]), None
    flat = stacked.reshape(ws * out.shape[0], out.shape[1])
    return out, dist.reduce_scatter_tensor(out, flat, group=group, async_op=True)
