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
ranks as threads on CPU buffers and with 4 and 8 ranks emulated on one H100; the cost model of issue 26
predicts it the only copy-engine design near BSP at gather_dim=1 on 8 GPUs (1.02-1.08x), where one GEMM
per peer reads and writes all of ``out`` eight times. Not yet run on peers.
"""

from __future__ import annotations

from typing import Any

from ...._problem import ProblemKey, Target
from ..._base import Params
from .._space import ce_grouped_seeds, ce_grouped_space
from ..copy_engine import CopyEngineVariant


def _group_reason(group: int, peers: int) -> str | None:
    """Why ``group`` peers per GEMM makes no sense for ``peers`` peers (of the powers of two, only the
    smallest that covers every peer is kept)."""
    if group < 1:
        return f"group: {group} must be at least 1"
    if group > 1 and group // 2 >= peers:
        return f"group: {group} for {peers} peers ({group // 2} already covers them all)"
    return None


class CeGroupedVariant(CopyEngineVariant):
    """``copy_engine`` with the peers dealt to ``streams`` side streams and their GEMMs grouped ``group``
    peers at a time (the module docstring)."""

    name = "ce_grouped"
    experimental = True
    space_of = staticmethod(ce_grouped_space)
    seeds_of = staticmethod(ce_grouped_seeds)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        """Why ``params`` cannot serve ``key``, else None: 3 ranks at least, streams and groups that fit
        the peers, then ``copy_engine``'s rules for one chunk in rotated order."""
        from autotaxer.kernels.common.lanes import _streams_reason

        gd, ws = key["gather_dim"], key.world_size
        if ws < 3:
            return "ce_grouped needs at least 3 ranks (with one peer it is copy_engine)"
        missing = {"streams", "group", "signal", "accumulate"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        reason = _streams_reason(params["streams"], ws - 1) or _group_reason(params["group"], ws - 1)
        if reason is not None:
            return reason
        reason = super().check(
            key, target, {**params, "chunks": 1, "gather_first": False, "order": "rotated"}
        )
        if reason is None and gd == 1 and (key["K"] // ws) * 2 % 16:
            return "K / world size: a strided copy's rows must be whole 16-byte units"
        return reason

    def plan(self, channel: Any, elem: int, key: ProblemKey, params: Params) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_grouped import make_grouped_plan

        return make_grouped_plan(
            channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"], elem=elem,
            streams=params["streams"], group=params["group"], fp32_accumulate=params["accumulate"] == "fp32",
        )  # fmt: skip

    def launcher(self) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_grouped import ag_gemm_ce_grouped

        return ag_gemm_ce_grouped


VARIANTS = [CeGroupedVariant()]
