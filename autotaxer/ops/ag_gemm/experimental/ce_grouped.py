"""``ce_grouped``: the copy-engine family for many peers: peer copies over several side streams, the
peers' GEMMs grouped so that ``B`` is read once per ``group`` peers, at both gather dims
(``gather_dim=1``: peers' K-slices land as column blocks of one buffer by strided copies).

Parameters: ``streams`` (side streams the peers are dealt to), ``group`` (consecutive peers per GEMM),
``signal`` (``memop`` | ``triton``) and ``accumulate`` (``gather_dim=1``: ``out`` | ``fp32``).
Experimental until measured on a 4- or 8-GPU machine: tuned by default from 3 ranks on (where those runs
measure it), opt-in with ``--variants`` below; it lands beside ``copy_engine`` and ``ce_fanout``, whose
records stay valid, and the 8-GPU run decides which of the three stay. NVIDIA only; see
``autotaxer.kernels.ag_gemm.experimental.ce_grouped``.

History: written 2026-11-25 for issue 26 (the copy-engine family for many peers), checked with 3, 4 and 8
ranks as threads on CPU buffers and with 4 and 8 ranks emulated on one H100; ``bench/cost_model.py``
predicts it the only copy-engine design near BSP at gather_dim=1 on 8 GPUs (1.02-1.08x), where one GEMM
per peer reads and writes all of ``out`` eight times. Not yet run on peers.
"""

from __future__ import annotations

from typing import Any

from autotaxer.kernels.common.lanes import _streams_reason

from ...._problem import ProblemKey, Target
from ..._base import Params, RunContext, Variant, Workspace
from ..._copy_engine import channel_buffers
from ..copy_engine import CopyEngineVariant

_STREAMS = (8, 4, 2, 1)
_GROUPS = (8, 4, 2, 1)


def _group_reason(group: int, peers: int) -> str | None:
    """Why ``group`` peers per GEMM makes no sense for ``peers`` peers (of the powers of two, only the
    smallest that covers every peer is kept)."""
    if group < 1:
        return f"group: {group} must be at least 1"
    if group > 1 and group // 2 >= peers:
        return f"group: {group} for {peers} peers ({group // 2} already covers them all)"
    return None


class CeGroupedVariant(Variant):
    name = "ce_grouped"
    experimental = True
    _copy_engine = CopyEngineVariant()  # the transport's own checks

    def unavailable_reason(self, target: Target) -> str | None:
        reason = self._copy_engine.unavailable_reason(target)
        return None if reason is None else f"ce_grouped: {reason}"

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "group": _GROUPS,
            "streams": _STREAMS,
            "signal": ("memop", "triton"),
            "accumulate": ("out",) if key["gather_dim"] == 0 else ("out", "fp32"),
        }

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Every peer on a stream of its own; GEMMs of half the peers (B read three times, the first GEMM
        after half the copies), then of every contiguous run. ``bench/cost_model.py`` puts these two
        first at 8 GPUs (groups of 2 lose there: one more GEMM launch and B read per pair)."""
        peers = key.world_size - 1
        streams = next(s for s in _STREAMS if _streams_reason(s, peers) is None)
        half = 1 << max(0, (peers + 1) // 2 - 1).bit_length()  # the power of two covering half the peers
        every = next(g for g in reversed(_GROUPS) if g >= peers)
        base = {"streams": streams, "signal": "memop", "accumulate": "out"}
        return [{"group": g, **base} for g in dict.fromkeys((half, every))]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        gd, ws = key["gather_dim"], key.world_size
        missing = {"streams", "group", "signal", "accumulate"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if ws < 3:
            return "ce_grouped needs at least 3 ranks (with one peer it is copy_engine)"
        reason = _streams_reason(params["streams"], ws - 1) or _group_reason(params["group"], ws - 1)
        if reason is not None:
            return reason
        as_copy_engine = {
            "signal": params["signal"], "chunks": 1, "accumulate": params["accumulate"],
            "gather_first": False, "order": "rotated",
        }  # fmt: skip
        reason = self._copy_engine.check(key, target, as_copy_engine)
        if reason is None and gd == 1 and (key["K"] // ws) * 2 % 16:
            return "K / world size: a strided copy's rows must be whole 16-byte units"
        return reason

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.experimental.ce_grouped import make_grouped_plan

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"ce_grouped: {reason}")

        def plan(channel: Any, elem: int) -> Any:
            return make_grouped_plan(
                channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"], elem=elem,
                streams=params["streams"], group=params["group"],
                fp32_accumulate=params["accumulate"] == "fp32",
            )  # fmt: skip

        buffers = channel_buffers(self.name, key, params, ctx, plan)
        if buffers["plan"].base.fp32_accumulate:
            buffers["acc"] = torch.empty((key["M"], key["N"]), dtype=torch.float32, device=ctx.device)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.ag_gemm.experimental.ce_grouped import ag_gemm_ce_grouped

        a_shard, b = inputs
        a_shard = a_shard.contiguous()  # the peer copies move whole rows; B may be kn or nk (vendor GEMMs)
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        elif not out.is_contiguous():
            raise ValueError("ce_grouped: out must be contiguous")
        buf = ws.buffers
        args = (buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf.get("acc"))
        return ag_gemm_ce_grouped(*args, watch=buf["watch"].tensor)


VARIANTS = [CeGroupedVariant()]
