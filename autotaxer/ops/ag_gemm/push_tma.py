"""``push_tma``: ``push`` with TMA loads in the GEMM (NVIDIA sm_90 and later).

The same producers, flags and inbox as ``push`` (so the same heap buffers); the consumer loads A and B
tiles by tensor-memory access, which frees the registers ``push``'s ``cp.async`` addresses hold and
lets 128x256 tiles and deeper pipelines fit. Its own variant, not a ``push`` parameter: ``push``'s
records stay valid (its kernel sources are untouched), and AMD keeps ``push`` alone.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from ..._target import tma_unavailable
from .._base import Params
from ._op import shard_shape
from .push import PushVariant


class PushTmaVariant(PushVariant):
    name = "push_tma"

    def unavailable_reason(self, target: Target) -> str | None:
        return super().unavailable_reason(target) or tma_unavailable(self.name, target)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        space = dict(super().search_space(key, target))
        space["num_stages"] = (4, 3, 5, 6) if key["M"] <= 256 else (4, 3, 5)  # 6: push's small-M reason
        space["prefetch_k"] = (0,)  # the L2 prefetch of B belongs to push's pointer loads
        return space

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """``push``'s starting points at small M; from M=256 the 128x128 tiles ``push`` uses and the
        128x256 tiles (one wave of 8 warps at M=512 on 2 GPUs) TMA makes affordable, at 3 stages (one
        rank, 2xH200: 99.7 against 107.4 us at M=512 with 4); at M=256 also 128x128 tiles at 6 stages (one
        rank, one H100: 57.5 against 60.7 us with 5 in one call; 59.8 with 5 against 63.2 with 4 in
        another)."""
        m = key["M"]
        if m < 256:
            return [dict(c, prefetch_k=0) for c in super().seed_configs(key, target)]

        def cfg(bn, warps, stages, comm, rc, kc):
            return dict(
                block_m=128, block_n=bn, block_k=64, group_m=8, num_warps=warps, num_stages=stages,
                comm_sms=comm, row_chunks=rc, k_chunks=kc, prefetch_k=0, group_across=0, push_order=0,
                release_each=0,
            )  # fmt: skip

        if m <= 512:
            seeds = [cfg(256, 8, 3, 0, 16, 8), cfg(128, 4, 4, 0, 16, 8), cfg(128, 4, 5, 16, 64, 1)]
            if m <= 256:
                seeds.append(cfg(128, 4, 6, 0, 16, 8))
        else:
            seeds = [cfg(256, 8, 3, 0, 16, 8), cfg(128, 4, 5, 16, 64, 1), cfg(256, 8, 3, 16, 64, 1)]
        return self._many_peers(key, seeds)

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
