"""``bsp``: the bulk-synchronous baseline of ``gemm_rs``: the vendor GEMM, then NCCL's reduce-scatter.

Every speedup of a ``gemm_rs`` variant is against this one, timed exactly as the fused ones are.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import out_shape


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


class BspVariant(Variant):
    name = "bsp"
    device_types = frozenset({"cuda", "cpu"})
    is_baseline = True

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        partial = torch.empty((key["M"], key["N"]), dtype=torch_dtype(key.dtype), device=ctx.device)
        return Workspace(key, dict(params), {"partial": partial})

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a, b = inputs
        partial = torch.matmul(a, b, out=ws.buffers["partial"])
        if out is None:
            out = torch.empty(out_shape(ws.key), dtype=a.dtype, device=a.device)
        return reduce_scatter(partial, out, ws.key["scatter_dim"], ctx.group)

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C slice, None)``: backward needs only the inputs it already holds."""
        return self.run(ws, inputs, ctx), None


VARIANTS = [BspVariant()]
