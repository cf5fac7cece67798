"""``copy_engine``: ``gemm_rs`` with no SM spent on communication: the owners' slices of the partial
product are computed in rotated order by vendor GEMMs and each is copied to its owner by the copy engine
while the next slices' GEMMs run; the owner sums the slots it received (fp32 accumulation).

Parameters: ``streams`` (side streams the owners are dealt to, at most one per peer) and ``signal``
(``memop`` | ``triton``: how flags are raised and awaited). NVIDIA only (``cuMemcpyAsync``); the
schedule is in ``autotaxer.kernels.gemm_rs.copy_engine``.

History: written 2026-11-25, checked on one GPU with 2, 4 and 8 emulated ranks; its speed against BSP
needs peers (the 2- and 8-GPU run issues).
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import GemmRs, out_shape

_STREAMS = (1, 2, 4, 8)


class CopyEngineVariant(Variant):
    name = "copy_engine"
    device_types = frozenset({"cuda"})

    def unavailable_reason(self, target: Target) -> str | None:
        from ..ag_gemm.copy_engine import CopyEngineVariant as AgCopyEngine

        return AgCopyEngine().unavailable_reason(target)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        from ..ag_gemm._lanes import _streams_reason

        streams = tuple(s for s in _STREAMS if _streams_reason(s, key.world_size - 1) is None)
        return {"streams": streams, "signal": ("memop", "triton")}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Every owner on a stream of its own, then one stream; stream memops."""
        space = self.search_space(key, target)["streams"]
        return [{"streams": s, "signal": "memop"} for s in dict.fromkeys((space[-1], 1))]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        missing = {"streams", "signal"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if key.world_size < 2:
            return "copy_engine needs at least 2 ranks"
        from ..ag_gemm._lanes import _streams_reason

        reason = _streams_reason(params["streams"], key.world_size - 1)
        if reason is not None:
            return reason
        if params["signal"] not in ("memop", "triton"):
            return f"signal: unknown back end {params['signal']!r}"
        if params["signal"] == "memop":
            from autotaxer.kernels.common.signal import memop_available

            reason = memop_available()
            if reason is not None:
                return f"signal=memop: {reason}"
        if key.dtype not in ("bf16", "fp16"):
            return f"dtype: copy_engine supports bf16 and fp16, not {key.dtype}"
        return None

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.copy_engine import get_channel
        from autotaxer.kernels.common.lanes import lane_streams
        from autotaxer.kernels.gemm_rs.copy_engine import make_rs_plan

        GemmRs().validate(key)
        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"copy_engine: {reason}")
        dtype = torch_dtype(key.dtype)
        channel = get_channel(ctx.iris(), params["signal"], ctx.rank, ctx.world_size, ctx.group)
        plan = make_rs_plan(
            channel, m=key["M"], n=key["N"], scatter_dim=key["scatter_dim"],
            elem=torch.empty((), dtype=dtype).element_size(), streams=params["streams"],
        )  # fmt: skip
        lane_streams(channel, len(plan.lanes))  # created now, not inside a CUDA-graph capture
        mo, no = out_shape(key)
        buffers = {
            "channel": channel,
            "plan": plan,
            "inbox": channel.arena(0).view(dtype),
            "staging": torch.empty((ctx.world_size - 1, mo, no), dtype=dtype, device=ctx.device),
            "ready": [torch.cuda.Event() for _ in range(ctx.world_size - 1)],
        }
        buffers["watch"] = ctx.watch_slot(key, self.name)  # bounds the flag waits, names this site
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
