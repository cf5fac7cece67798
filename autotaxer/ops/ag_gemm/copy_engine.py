"""``copy_engine``: peer copies by the copy engine on a side stream, vendor GEMMs as chunks land.

No SM does communication: each rank pushes its shard into every peer's Iris inbox with
``cuMemcpyAsync`` over NVLink and raises a flag per chunk (Triton release kernels with a
device-resident epoch, or CUDA stream memops); the caller's stream runs the local shard's GEMM first,
then each peer chunk's GEMM once its flag is up. See ``autotaxer.kernels.ag_gemm.copy_engine`` for the
schedule.

Parameters: ``signal`` (``triton`` | ``memop``), ``chunks`` per peer shard, ``gather_first`` (wait for
all, then one GEMM: small M, ``gather_dim=0`` only), ``accumulate`` (``gather_dim=1``: ``out`` adds
into the output, ``fp32`` into an fp32 workspace converted at the end) and ``order`` of the peers.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace

_CHUNKS = (1, 2, 4, 8)


class CopyEngineVariant(Variant):
    name = "copy_engine"
    device_types = frozenset({"cuda"})

    def unavailable_reason(self, target: Target) -> str | None:
        reason = super().unavailable_reason(target)
        if reason is not None:
            return reason
        if not target.is_nvidia:
            return "copy_engine issues peer copies with cuMemcpyAsync (NVIDIA only)"
        for module in ("cuda.bindings", "iris"):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                return f"copy_engine needs the {module} package"
        return None

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        gd = key["gather_dim"]
        # Most decisive parameter first: a capped sweep spread over the grid then covers it.
        return {
            "gather_first": (False, True) if gd == 0 else (False,),
            "signal": ("memop", "triton"),
            "chunks": _CHUNKS,
            "accumulate": ("out",) if gd == 0 else ("out", "fp32"),
            "order": ("rotated",) if key.world_size <= 2 else ("rotated", "reverse"),
        }

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """The 2xH200 tuning run's usual winners: one chunk (two at large M), stream memops."""
        gather_first = key["gather_dim"] == 0 and key["M"] <= 256
        return [
            {"gather_first": gather_first, "signal": s, "chunks": c, "accumulate": "out", "order": "rotated"}
            for s, c in (("memop", 1), ("memop", 2), ("triton", 1))
        ]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.ag_gemm.copy_engine import MAX_CHUNKS

        gd, ws = key["gather_dim"], key.world_size
        missing = {"signal", "chunks", "gather_first", "accumulate", "order"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if ws < 2:
            return "copy_engine needs at least 2 ranks"
        if params["signal"] not in ("memop", "triton"):
            return f"signal: unknown back end {params['signal']!r}"
        if params["signal"] == "memop":
            from autotaxer.kernels.common.signal import memop_available

            reason = memop_available()
            if reason is not None:
                return f"signal=memop: {reason}"
        rows = key["M"] // ws if gd == 0 else key["M"]
        chunks = params["chunks"]
        if not 1 <= chunks <= min(rows, MAX_CHUNKS):
            return f"chunks: {chunks} outside 1..{min(rows, MAX_CHUNKS)} for {rows} shard rows"
        if params["gather_first"] and (gd != 0 or chunks != 1):
            return "gather_first: only with gather_dim=0 and chunks=1"
        if params["accumulate"] not in ("out", "fp32") or (gd == 0 and params["accumulate"] != "out"):
            return f"accumulate: {params['accumulate']!r} is not valid for gather_dim={gd}"
        if params["order"] not in ("rotated", "reverse"):
            return f"order: unknown order {params['order']!r}"
        if key.dtype not in ("bf16", "fp16"):
            return f"dtype: copy_engine supports bf16 and fp16, not {key.dtype}"
        return None

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.copy_engine import get_channel, make_plan

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"copy_engine: {reason}")
        dtype = torch_dtype(key.dtype)
        elem = torch.empty((), dtype=dtype).element_size()
        channel = get_channel(ctx.iris(), params["signal"], ctx.rank, ctx.world_size, ctx.group)
        plan = make_plan(
            channel,
            m=key["M"],
            k=key["K"],
            gather_dim=key["gather_dim"],
            elem=elem,
            chunks=params["chunks"],
            order=params["order"],
            gather_first=params["gather_first"],
            fp32_accumulate=params["accumulate"] == "fp32",
        )
        inbox = channel.arena(0).view(dtype)
        buffers: dict[str, Any] = {"channel": channel, "plan": plan, "inbox": inbox}
        if plan.fp32_accumulate:
            buffers["acc"] = torch.empty((key["M"], key["N"]), dtype=torch.float32, device=ctx.device)
        buffers["watch"] = ctx.watch_slot(key, self.name)  # bounds the flag waits, names this site
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.ag_gemm.copy_engine import ag_gemm_ce

        a_shard, b = inputs
        a_shard = a_shard.contiguous()  # the peer copies move whole rows; B may be kn or nk (vendor GEMMs)
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        elif not out.is_contiguous():
            raise ValueError("copy_engine: out must be contiguous")
        buf = ws.buffers
        args = (buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf.get("acc"))
        return ag_gemm_ce(*args, watch=buf["watch"].tensor)


VARIANTS = [CopyEngineVariant()]
