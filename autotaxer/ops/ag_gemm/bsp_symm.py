"""``bsp_symm``: BSP with NCCL's symmetric-memory all-gather (NCCL >= 2.27), a BSP form users have today.

The shard is copied into a symmetric window and gathered into another (``autotaxer.ops._nccl_window``),
so NCCL runs its symmetric kernels instead of its ring; then the vendor GEMM, as ``bsp``. It is a BSP
form: the tuner measures it beside ``bsp`` and every speedup is against the faster of the two
(``Variant.bsp_form``). The copy of the shard (1/world_size of A) costs one device copy per call.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Params, RunContext, Workspace
from .._nccl_window import SymmetricBspForm, window_tensor
from ._op import shard_shape
from .bsp import BspVariant


class BspSymmVariant(SymmetricBspForm, BspVariant):
    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        ws = super().prepare(key, params, ctx)
        dtype = torch_dtype(key.dtype)
        shard = shard_shape(key)
        ws.buffers["send"] = window_tensor(shard, dtype, ctx.group, ctx.device, slot=0)
        ws.buffers["gathered"] = window_tensor((ctx.world_size, *shard), dtype, ctx.group, ctx.device, slot=1)
        return ws

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        a_shard, b = inputs
        send = ws.buffers["send"]
        send.copy_(a_shard)
        return super().run(ws, (send, b), ctx, out)


VARIANTS = [BspSymmVariant()]
