"""``bsp``: the bulk-synchronous baseline of ``gemm_rs``: the vendor GEMM, then NCCL's reduce-scatter.

Every speedup of a ``gemm_rs`` variant is against this one, timed exactly as the fused ones are.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from .._collectives import reduce_scatter
from ._op import out_shape


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
