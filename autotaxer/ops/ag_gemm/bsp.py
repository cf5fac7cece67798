"""``bsp``: the bulk-synchronous baseline, a collective all-gather then the vendor GEMM.

Every speedup autotaxer reports is against this variant, timed exactly as the fused ones are.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from .._collectives import all_gather_shards
from ._op import shard_shape


class BspVariant(Variant):
    name = "bsp"
    device_types = frozenset({"cuda", "cpu"})
    is_baseline = True

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        dtype = torch_dtype(key.dtype)
        gathered = torch.empty((ctx.world_size, *shard_shape(key)), dtype=dtype, device=ctx.device)
        buffers = {"gathered": gathered}
        if key["gather_dim"] == 1:
            buffers["a_full"] = torch.empty((key["M"], key["K"]), dtype=dtype, device=ctx.device)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        gathered = ws.buffers["gathered"]
        all_gather_shards(a_shard, gathered, ctx)
        if ws.key["gather_dim"] == 0:
            a = gathered.view(ws.key["M"], ws.key["K"])
        else:
            a = ws.buffers["a_full"]
            m, kr = gathered.shape[1], gathered.shape[2]
            a.view(m, ctx.world_size, kr).copy_(gathered.permute(1, 0, 2))
        return torch.matmul(a, b, out=out)

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C, gathered A)``: the all-gather lands in a fresh ``(M, K)`` tensor that backward keeps."""
        import torch

        a_shard, b = inputs
        key = ws.key
        shards = torch.empty((ctx.world_size, *shard_shape(key)), dtype=a_shard.dtype, device=a_shard.device)
        all_gather_shards(a_shard, shards, ctx)
        if key["gather_dim"] == 0:
            a = shards.view(key["M"], key["K"])
        else:
            a = shards.permute(1, 0, 2).reshape(key["M"], key["K"])
        return torch.matmul(a, b), a


VARIANTS = [BspVariant()]
