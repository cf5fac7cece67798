"""``copy_engine``: ``gemm_rs`` with no SM spent on communication: the owners' slices of the partial
product are computed in rotated order by vendor GEMMs and each is copied to its owner by the copy engine
while the next slices' GEMMs run; the owner sums the slots it received (fp32 accumulation).

Parameters: ``streams`` (side streams the owners are dealt to, at most one per peer) and ``signal``
(``memop`` | ``triton``: how flags are raised and awaited). NVIDIA only (``cuMemcpyAsync``); the
schedule is in ``autotaxer.kernels.gemm_rs.copy_engine``.

History: written 2026-11-25, checked on one GPU with 2, 4 and 8 emulated ranks. Measured: 2×H200, 5 and
15 of the shipped ws2 eager and graph tables' 20 ``gemm_rs`` records
(``bench/results/2026-11-28_ws2_finish_h200x2/``); 4×H200 (2026-11-28, dependent graph timing, tuned):
1.01-1.43× BSP over the TP4 layer's 8 ``gemm_rs`` keys, served at five of them from M=4096 (1.16-1.55×;
``bench/results/2026-11-28_tp4_tuned_layer_h200x4/``); not yet at 8 GPUs.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params, RunContext, Workspace
from .._copy_engine import CopyEngineBase, channel_buffers, transport_error
from ._op import GemmRs, out_shape
from ._space import copy_engine_seeds, copy_engine_space


class CopyEngineVariant(CopyEngineBase):
    name = "copy_engine"
    space_of = staticmethod(copy_engine_space)
    seeds_of = staticmethod(copy_engine_seeds)  # every owner on a stream of its own, then one stream

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.common.lanes import _streams_reason

        missing = {"streams", "signal"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        return transport_error(self.name, key, params["signal"]) or _streams_reason(
            params["streams"], key.world_size - 1
        )

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.gemm_rs.copy_engine import make_rs_plan

        GemmRs().validate(key)
        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"copy_engine: {reason}")

        def plan(channel: Any, elem: int) -> Any:
            return make_rs_plan(
                channel, m=key["M"], n=key["N"], scatter_dim=key["scatter_dim"], elem=elem,
                streams=params["streams"],
            )  # fmt: skip

        buffers = channel_buffers(self.name, key, params, ctx, plan)
        mo, no = out_shape(key)
        dtype = buffers["inbox"].dtype
        buffers["staging"] = torch.empty((ctx.world_size - 1, mo, no), dtype=dtype, device=ctx.device)
        buffers["ready"] = [torch.cuda.Event() for _ in range(ctx.world_size - 1)]
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.gemm_rs.copy_engine import gemm_rs_ce

        a, b = inputs
        if out is None:  # fresh from the caching allocator: no later call writes it
            out = torch.empty(out_shape(ws.key), dtype=a.dtype, device=a.device)
        buf = ws.buffers
        return gemm_rs_ce(
            buf["channel"],
            buf["plan"],
            buf["inbox"],
            buf["staging"],
            buf["ready"],
            a,
            b,
            out,
            watch=buf["watch"].tensor,
        )

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C slice, None)``: backward needs only the inputs it already holds."""
        return self.run(ws, inputs, ctx), None


VARIANTS = [CopyEngineVariant()]
