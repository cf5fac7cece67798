"""``bsp_symm``: ``gemm_rs``'s BSP with NCCL's symmetric-memory reduce-scatter (NCCL >= 2.27).

The GEMM writes its partial product into a symmetric window (``autotaxer.ops._nccl_window``; with
``scatter_dim=1`` each rank's columns are first made contiguous in a second window), NCCL reduce-scatters
it into a third with its symmetric kernels, and the slice is copied into a fresh output. A BSP form: the
tuner measures it beside ``bsp`` and every speedup is against the faster of the two.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Params, RunContext, Workspace
from .._nccl_window import SymmetricBspForm, window_tensor
from ._op import out_shape
from .bsp import BspVariant


class BspSymmVariant(SymmetricBspForm, BspVariant):
    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        dtype = torch_dtype(key.dtype)
        m, n, world = key["M"], key["N"], ctx.world_size
        buffers = {
            "partial": window_tensor((m, n), dtype, ctx.group, ctx.device, slot=0),
            "recv": window_tensor(out_shape(key), dtype, ctx.group, ctx.device, slot=1),
        }
        if key["scatter_dim"] == 1:  # rank r's columns, contiguous, at block r
            buffers["stacked"] = window_tensor((world, m, n // world), dtype, ctx.group, ctx.device, slot=2)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch
        import torch.distributed as dist

        a, b = inputs
        key, buf, world = ws.key, ws.buffers, ctx.world_size
        partial = torch.matmul(a, b, out=buf["partial"])
        send = partial
        if key["scatter_dim"] == 1:
            m, n = partial.shape
            send = buf["stacked"].copy_(partial.view(m, world, n // world).permute(1, 0, 2))
        recv = buf["recv"]
        dist.reduce_scatter_tensor(recv, send.reshape(world * recv.shape[0], recv.shape[1]), group=ctx.group)
        if out is None:
            out = torch.empty(recv.shape, dtype=recv.dtype, device=recv.device)
        return out.copy_(recv)


VARIANTS = [BspSymmVariant()]
