"""``ce_fanout``: ``copy_engine`` for three or more ranks: peer copies on several side streams at once,
and at ``gather_dim=0`` the peers' rows multiplied in one GEMM per contiguous run of ranks.

Parameters: ``streams`` (side streams the peers are dealt to, at most one per peer: 8 with 7 peers
means 7), ``gemms`` (``range``: one GEMM per run of
peers, ``gather_dim=0`` only; ``peer``: one per peer and chunk), ``signal`` (``memop`` | ``triton``),
``chunks`` per peer shard and ``accumulate`` (``gather_dim=1``). Experimental: tuned by default from 3
ranks on, opt-in with ``--variants`` below. NVIDIA only (``cuMemcpyAsync``); see
``autotaxer.kernels.ag_gemm.experimental.ce_fanout``.

Measured: 4×H200 (2026-11-22), one record of the shipped ws4 graph table; 4×H200 (2026-11-28,
dependent graph timing, tuned) 0.81-1.11× BSP over the TP4 layer's 8 ``ag_gemm`` keys, served at M=16384
N=14336 (1.05×, kept by the in-step check; ``bench/results/2026-11-28_tp4_tuned_layer_h200x4/``). Its
``range`` GEMMs on a middle rank take 16-33 µs more than the first and last ranks' single run at M=1024
(cuBLAS alone on one H200, ``bench/results/2026-11-29_gemm_split_h200/``; ``ce_local_rest``). Not yet at
8 GPUs. ``chunks`` 2 and 4 at ``gather_dim=0`` left the search space on 2026-11-29: never this variant's
own best at any 4-GPU key they were timed at (``bench/results/2026-11-29_retired_cpu``).
"""

from __future__ import annotations

from typing import Any

from ...._problem import ProblemKey, Target
from ..._base import Params
from .._space import ce_fanout_seeds, ce_fanout_space
from ..copy_engine import CopyEngineVariant


def tuned_space(key: ProblemKey) -> dict[str, Any]:
    """:func:`ce_fanout_space` with one chunk a peer at ``gather_dim=0``.

    Several chunks a peer (one GEMM each) left the space there on 2026-11-29: at 4 GPUs, 2 and 4 chunks
    were never this variant's own best at any of 11 and 8 keys (1.03-2.3x the key's best, 4xH200 and
    4xH100, ``bench/results/2026-11-29_retired_cpu``); a GEMM per chunk costs 2.9-3.7x the whole
    product at M=1024 (``bench/results/2026-11-29_gemm_split_h200``). ``gather_dim=1``, never timed on
    peers, keeps them; a configuration naming them still runs."""
    space = ce_fanout_space(key)
    if key["gather_dim"] == 0:
        space["chunks"] = (1,)
    return space


class CeFanoutVariant(CopyEngineVariant):
    name = "ce_fanout"
    experimental = True
    space_of = staticmethod(tuned_space)
    seeds_of = staticmethod(ce_fanout_seeds)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.common.lanes import _streams_reason

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
        return super().check(key, target, {**params, "gather_first": False, "order": "rotated"})

    def plan(self, channel: Any, elem: int, key: ProblemKey, params: Params) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_fanout import make_fanout_plan

        return make_fanout_plan(
            channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"], elem=elem, chunks=params["chunks"],
            streams=params["streams"], gemms=params["gemms"], fp32_accumulate=params["accumulate"] == "fp32",
        )  # fmt: skip

    def launcher(self) -> Any:
        from autotaxer.kernels.ag_gemm.experimental.ce_fanout import ag_gemm_ce_fanout

        return ag_gemm_ce_fanout


VARIANTS = [CeFanoutVariant()]
