"""``push_tma``: ``push`` with TMA loads in the GEMM (NVIDIA sm_90 and later).

The same producers, flags and inbox as ``push`` (so the same heap buffers); the consumer loads A and B
tiles by tensor-memory access, which frees the registers ``push``'s ``cp.async`` addresses hold and
lets 128x256 tiles and deeper pipelines fit. Its own variant, not a ``push`` parameter: ``push``'s
records stay valid (its kernel sources are untouched), and AMD keeps ``push`` alone.

Measured: 2×H200, 2 records of the shipped ws2 eager table; 4×H200 (2026-11-22), 4 records of each
shipped ws4 table (M=512-1024, ``bench/results/2026-11-22_push_tma/``), and on 4×H100 (2026-11-28,
seeds, dependent timing) 0.29-1.01× BSP at the TP4 layer's keys at M=1024 and 4096
(``bench/results/2026-11-28_tp4_layer_h100x4/``); not yet at 8 GPUs.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from ..._target import tma_unavailable
from .._base import Params
from ._op import shard_shape
from ._space import push_tma_seeds, push_tma_space
from .iris_fused import PushVariant


class PushTmaVariant(PushVariant):
    name = "push_tma"

    def unavailable_reason(self, target: Target) -> str | None:
        return super().unavailable_reason(target) or tma_unavailable(self.name, target)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return push_tma_space(key)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """:func:`._space.push_tma_seeds`: ``push``'s at small M, TMA's wider tiles from M=256."""
        return push_tma_seeds(key, target)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        reason = super().check(key, target, params)
        if reason is not None:
            return reason
        ms, _ = shard_shape(key)
        if key["gather_dim"] == 0 and ms % params["block_m"]:
            return f"block_m: {params['block_m']}-row tiles straddle {ms}-row shards (TMA reads one owner)"
        if params.get("prefetch_k"):
            return "prefetch_k: push_tma has no L2 prefetch"
        return None

    def launcher(self):
        from autotaxer.kernels.ag_gemm.push_tma import ag_gemm_push_tma

        return ag_gemm_push_tma


VARIANTS = [PushTmaVariant()]
