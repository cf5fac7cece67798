"""``ce_local_rest``: the copy-engine all-gather for three or more ranks with two GEMMs a call, the local
shard's and then one over every peer's rows (``gather_dim=0``).

Parameters: ``streams`` (side streams the peers are dealt to, at most one per peer counts) and ``signal``
(``memop`` | ``triton``). One copy per peer; each receiving inbox holds its peers in arrival order, so their
rows are one matrix; on the ranks whose peers' rows are two runs of ``out`` the GEMM writes a scratch copied
into ``out`` (a same-device copy, which the driver runs on the SMs). Issue 47. Measured with cuBLAS alone on
one H200, no communication (``bench/results/2026-11-29_gemm_split_h200/``): at M=1024 on four ranks its GEMMs
and copy take 74 and 377 µs (N=2560, 14336), against 86 and 389 for ``ce_fanout``'s two runs on a middle rank
and 105 and 360 for one GEMM per peer. From M=2048 the copy costs more than a second run's tail. Experimental
and opt-in (``--variants ce_local_rest``) until it wins on GPUs; checked on ranks emulated on CPU (3, 4 and 8)
and on one GPU (4 and 8); not yet run on peers. NVIDIA only (``cuMemcpyAsync``); see
``autotaxer.kernels.ag_gemm.experimental.ce_local_rest``.
"""

from __future__ import annotations

from typing import Any

from ...._problem import ProblemKey, Target, torch_dtype
from ..._base import Params, RunContext, Workspace
from .._space import CE_SIGNALS, CE_STREAMS, _stream_counts
from ..copy_engine import CopyEngineVariant


# Here rather than in ``.._space`` (whose source the shipped records of every variant there are hashed
# with): a new variant's space must not make their records stale.
def ce_local_rest_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``ce_local_rest``'s space: the lanes and the flags' back end."""
    return {"streams": CE_STREAMS, "signal": CE_SIGNALS}


def ce_local_rest_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """A lane per peer (up to 8), then half as many, with stream memops; then a lane per peer with the
    epoch kernels."""
    counts = _stream_counts(key)
    seeds = [{"streams": s, "signal": "memop"} for s in counts[:2]]
    return [*seeds, {"streams": counts[0], "signal": "triton"}]


class CeLocalRestVariant(CopyEngineVariant):
    name = "ce_local_rest"
    experimental = True
    space_of = staticmethod(ce_local_rest_space)
    seeds_of = staticmethod(ce_local_rest_seeds)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.common.lanes import _streams_reason

        missing = {"streams", "signal"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if key.world_size < 3:
            return "ce_local_rest needs at least 3 ranks (with one peer it is copy_engine with one chunk)"
        if key["gather_dim"] != 0:
            return "ce_local_rest needs gather_dim=0 (the peers' K-slices of gather_dim=1 are not one matrix)"
        reason = _streams_reason(params["streams"], key.world_size - 1)
        if reason is not None:
            return reason
        # signal and dtype mean what they mean for copy_engine (the same channel)
        fixed = {"chunks": 1, "gather_first": False, "accumulate": "out", "order": "rotated"}
        return super().check(key, target, {"signal": params["signal"], **fixed})

    def plan(self, channel: Any, elem: int, key: ProblemKey, params: Params) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import make_rest_plan

        return make_rest_plan(
            channel, m=key["M"], n=key["N"], k=key["K"], elem=elem, dtype=torch_dtype(key.dtype),
            streams=params["streams"],
        )  # fmt: skip

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        """``copy_engine``'s workspace (channel, plan, lanes, watch slot), which asks for ``accumulate``;
        ``gather_dim=0`` accumulates in ``out``."""
        ws = super().prepare(key, {**params, "accumulate": "out"}, ctx)
        return Workspace(key, dict(params), ws.buffers)

    def launcher(self) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import ag_gemm_ce_local_rest

        return ag_gemm_ce_local_rest


VARIANTS = [CeLocalRestVariant()]
