"""``ce_pull``: the copy-engine all-gather by pulls: each rank publishes its shard in its own inbox slot
once, every rank reads the peers' slots on its own lanes, and the GEMMs wait on CUDA events behind the
pulled chunks (no spin kernel on the caller's stream). Issue 47's answer to torch's fused op winning at
four GPUs (pulls on two streams) where the push schedules did not.

Parameters: ``streams`` (lanes the peers are dealt to, at most one per peer counts), ``signal`` (``memop``
| ``triton``: the ready flags and ``done`` tokens), ``chunks`` per pulled shard, ``accumulate``
(``gather_dim=1``) and ``gemms`` (``caller``: the peers' GEMMs on the caller's stream behind events, the
first design and the default where the parameter is absent; ``lanes``, gather_dim=0: each on the lane that
pulled it, torch's fused op's schedule). Experimental and opt-in (``--variants ce_pull``) until it wins
on GPUs; NVIDIA only (``cuMemcpyAsync``); see ``autotaxer.kernels.ag_gemm.experimental.ce_pull``.

Measured: 2×H200 (2026-11-28), correct (bf16/fp16, both B layouts, graph replays) and no faster than
``copy_engine`` at one peer (within 3% at 3 of the TP2 layer's 8 ``ag_gemm`` keys at M 1024/4096, 5-32%
slower at the rest: ``bench/results/2026-11-28_tune_layer_ws2_h200x2/``). 4×H200 (2026-11-28): correct
(the same check at 4 ranks); over the TP4 layer's 16 ``ag_gemm`` keys (M 1024-16384) faster than
``copy_engine`` and ``ce_fanout`` at small N from M=4096 (0.99-1.40× BSP against 0.87-1.25×), behind
``torch_fused`` there (1.37-1.69×), within a few percent of them at N=7168/14336, below BSP at M=1024;
won three M=4096 keys of an eager-timed tune and none in the step's check nor in graph timing
(``bench/results/2026-11-28_tp4_tuned_layer_h200x4/``), all with ``gemms="caller"``; ``gemms="lanes"``
(added after that run) is checked on the emulated ranks only. Not yet at 8 GPUs.
"""

from __future__ import annotations

from typing import Any

from ...._problem import ProblemKey, Target
from ..._base import Params
from .._space import CE_FANOUT_CHUNKS, CE_SIGNALS, CE_STREAMS, _stream_counts
from ..copy_engine import CopyEngineVariant


# Here rather than in ``.._space`` (whose source the shipped records of every variant there are hashed
# with): a new variant's space must not make their records stale.
def ce_pull_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``ce_pull``'s space: lanes pulling the peers' shards, the flags' back end, chunks per pulled shard
    and (gather_dim=1) the accumulation."""
    accumulate = ("out",) if key["gather_dim"] == 0 else ("out", "fp32")
    gemms = ("caller", "lanes") if key["gather_dim"] == 0 else ("caller",)
    return {
        "streams": CE_STREAMS, "signal": CE_SIGNALS, "chunks": CE_FANOUT_CHUNKS, "accumulate": accumulate,
        "gemms": gemms,
    }  # fmt: skip


def ce_pull_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """One lane (pulls one peer after another, rank-rotated: each source serves one reader at a time),
    then a lane per peer and two lanes, GEMMs on the caller's stream; then (gather_dim=0) torch's fused
    op's schedule: two lanes (one at 2 ranks), each GEMM behind its own copy. One copy per peer, stream
    memops."""
    base = {"signal": "memop", "chunks": 1, "accumulate": "out", "gemms": "caller"}
    counts = _stream_counts(key)
    seeds = [{"streams": s, **base} for s in dict.fromkeys((1, counts[0], 2)) if s in counts]
    if key["gather_dim"] == 0:  # at 2 ranks one lane: the peer's copy and then its GEMM beside the local one
        seeds.append({**base, "streams": 2 if 2 in counts else 1, "gemms": "lanes"})
    return seeds


class CePullVariant(CopyEngineVariant):
    name = "ce_pull"
    experimental = True
    space_of = staticmethod(ce_pull_space)
    seeds_of = staticmethod(ce_pull_seeds)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.common.lanes import _streams_reason

        missing = {"streams", "signal", "chunks", "accumulate"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if key.world_size < 2:
            return "ce_pull needs at least 2 ranks"
        reason = _streams_reason(params["streams"], key.world_size - 1)
        if reason is not None:
            return reason
        gemms = params.get("gemms", "caller")
        if gemms not in ("caller", "lanes"):
            return f"gemms: 'caller' or 'lanes', got {gemms!r}"
        if gemms == "lanes" and key["gather_dim"] != 0:
            return "gemms='lanes' needs gather_dim=0 (with gather_dim=1 the peers' GEMMs add into one block)"
        # signal, chunks, accumulate and dtype mean what they mean for copy_engine (the same channel)
        base = {n: v for n, v in params.items() if n != "gemms"}
        return super().check(key, target, {**base, "gather_first": False, "order": "rotated"})

    def plan(self, channel: Any, elem: int, key: ProblemKey, params: Params) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_pull import make_pull_plan

        return make_pull_plan(
            channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"], elem=elem, chunks=params["chunks"],
            streams=params["streams"], fp32_accumulate=params["accumulate"] == "fp32",
            gemms=params.get("gemms", "caller"),
        )  # fmt: skip

    def launcher(self) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_pull import ag_gemm_ce_pull

        return ag_gemm_ce_pull

    def saves_for_backward(self) -> bool:
        """True: the inbox holds every shard once the lanes joined, so training calls and ``return_A`` get
        the gathered A from :meth:`run_for_backward` (copied out at the end of the call)."""
        return True


VARIANTS = [CePullVariant()]
