"""``ce_fanout``: ``copy_engine`` for three or more ranks: peer copies on several side streams at once,
and at ``gather_dim=0`` the peers' rows multiplied in one GEMM per contiguous run of ranks.

Parameters: ``streams`` (side streams the peers are dealt to, at most one per peer: 8 with 7 peers
means 7), ``gemms`` (``range``: one GEMM per run of
peers, ``gather_dim=0`` only; ``peer``: one per peer and chunk), ``signal`` (``memop`` | ``triton``),
``chunks`` per peer shard and ``accumulate`` (``gather_dim=1``). Experimental until measured on a 4-
or 8-GPU machine: tuned by default from 3 ranks on, opt-in with ``--variants`` below. NVIDIA only
(``cuMemcpyAsync``); see ``autotaxer.kernels.ag_gemm.experimental.ce_fanout``.
"""

from __future__ import annotations

from typing import Any

from autotaxer.kernels.common.lanes import _streams_reason

from ...._problem import ProblemKey, Target, torch_dtype
from ..._base import Params, RunContext, Variant, Workspace
from ..copy_engine import CopyEngineVariant

_STREAMS = (8, 4, 2, 1)
_CHUNKS = (1, 2, 4)


class CeFanoutVariant(Variant):
    name = "ce_fanout"
    experimental = True
    _copy_engine = CopyEngineVariant()  # the transport's own checks

    def unavailable_reason(self, target: Target) -> str | None:
        reason = self._copy_engine.unavailable_reason(target)
        return None if reason is None else f"ce_fanout: {reason}"

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        gd = key["gather_dim"]
        return {
            "streams": _STREAMS,
            "gemms": ("range", "peer") if gd == 0 else ("peer",),
            "signal": ("memop", "triton"),
            "chunks": _CHUNKS,
            "accumulate": ("out",) if gd == 0 else ("out", "fp32"),
        }

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Every peer on a stream of its own (up to 8 streams), then half as many streams; one copy per
        peer (a copy-engine copy costs about 16 µs however small), stream memops."""
        streams = [s for s in _STREAMS if _streams_reason(s, key.world_size - 1) is None][:2]
        gemms = "range" if key["gather_dim"] == 0 else "peer"
        base = {"gemms": gemms, "signal": "memop", "chunks": 1, "accumulate": "out"}
        return [{"streams": s, **base} for s in streams]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        gd, ws = key["gather_dim"], key.world_size
        missing = {"streams", "gemms", "signal", "chunks", "accumulate"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if ws < 3:
            return "ce_fanout needs at least 3 ranks (with one peer it is copy_engine)"
        reason = _streams_reason(params["streams"], ws - 1)
        if reason is not None:
            return reason
        if params["gemms"] not in ("range", "peer") or (gd != 0 and params["gemms"] != "peer"):
            return f"gemms: {params['gemms']!r} is not valid for gather_dim={gd}"
        if params["gemms"] == "range" and params["chunks"] != 1:
            return "chunks: a GEMM per run of peers waits for every chunk; only 1 is useful"
        # signal, chunks, accumulate and dtype mean what they mean for copy_engine (same channel)
        as_copy_engine = {
            "signal": params["signal"], "chunks": params["chunks"], "accumulate": params["accumulate"],
            "gather_first": False, "order": "rotated",
        }  # fmt: skip
        return self._copy_engine.check(key, target, as_copy_engine)

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.copy_engine import get_channel
        from autotaxer.kernels.ag_gemm.experimental.ce_fanout import lane_streams, make_fanout_plan

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"ce_fanout: {reason}")
        dtype = torch_dtype(key.dtype)
        channel = get_channel(ctx.iris(), params["signal"], ctx.rank, ctx.world_size, ctx.group)
        plan = make_fanout_plan(
            channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"],
            elem=torch.empty((), dtype=dtype).element_size(), chunks=params["chunks"],
            streams=params["streams"], gemms=params["gemms"], fp32_accumulate=params["accumulate"] == "fp32",
        )  # fmt: skip
        lane_streams(channel, len(plan.lanes))  # created now, not inside a CUDA-graph capture
        buffers: dict[str, Any] = {"channel": channel, "plan": plan, "inbox": channel.arena(0).view(dtype)}
        if plan.base.fp32_accumulate:
            buffers["acc"] = torch.empty((key["M"], key["N"]), dtype=torch.float32, device=ctx.device)
        buffers["watch"] = ctx.watch_slot(key, self.name)  # bounds the flag waits, names this site
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.ag_gemm.experimental.ce_fanout import ag_gemm_ce_fanout

        a_shard, b = inputs
        a_shard = a_shard.contiguous()  # the peer copies move whole rows; B may be kn or nk (vendor GEMMs)
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        elif not out.is_contiguous():
            raise ValueError("ce_fanout: out must be contiguous")
        buf = ws.buffers
        args = (buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf.get("acc"))
        return ag_gemm_ce_fanout(*args, watch=buf["watch"].tensor)


VARIANTS = [CeFanoutVariant()]
