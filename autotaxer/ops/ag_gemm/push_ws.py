"""``push_ws``: ``push``'s transfer beside a warp-specialised Gluon GEMM (NVIDIA sm_90 only).

The producers are ``push``'s kernel (its producer steps alone, on a side stream, ``comm_sms`` CTAs) or,
with ``comm_sms=0``, the GEMM's own CTAs before their tiles. The GEMM is ``kernels/ag_gemm_ws.py``: one
load warp per CTA waits for each peer chunk's flag right before the TMA loads that read it, so no MMA
warp ever waits and the K loop never drains at a chunk boundary (the per-chunk waits of
``push``/``push_tma`` sit in the MMA warps' own loop). Same heap buffers as ``push``. Calls whose
tensors TMA cannot address run ``push``'s kernel with the same parameters instead (same buffers, the
epoch kept in step). ``num_warps`` 8 means two MMA warpgroups, 4 one.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params
from .push import PushVariant
from .push_tma import _sm


class PushWsVariant(PushVariant):
    name = "push_ws"
    experimental = True  # opt-in (``--variants``) until measured on two GPUs

    def unavailable_reason(self, target: Target) -> str | None:
        reason = super().unavailable_reason(target)
        if reason is not None:
            return reason
        if target.is_amd or _sm(target.arch) != 90:
            return f"{self.name}: Hopper's wgmma and TMA (sm_90) only, this is {target.arch}"
        try:
            from triton.experimental import gluon  # noqa: F401
        except Exception as exc:
            return f"{self.name}: cannot import triton's Gluon ({type(exc).__name__}: {exc})"
        return None

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        space = dict(super().search_space(key, target))
        space.update(
            block_m=(128,),
            block_n=(256, 128),
            block_k=(64,),
            num_warps=(8, 4),
            num_stages=(4, 3, 5, 6),
            comm_sms=(4, 0, 2, 8, 16),  # 0: the consumer CTAs move the shard first (no producer kernel)
            prefetch_k=(0,),
        )
        return space

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Four producer CTAs (the consumer keeps one wave of 128 tiles on 128 SMs; 2xH200, N=K=8192,
        graph: 4 beat 8 at M = 256-512 and at gather_dim=0 M=1024) pushing 4 row x 8 K chunks, with
        128x128 tiles on two MMA warpgroups up to M=256 and 128x256 tiles above; 16 producers for the
        largest shards (gather_dim=1 M=4096: 930 against 1126 us with 4)."""

        fields = ("block_n", "num_warps", "num_stages", "comm_sms", "row_chunks", "k_chunks")
        rows = [(128, 8, 5, 4, 4, 8), (128, 4, 6, 4, 4, 8), (128, 8, 5, 8, 4, 8)]
        if key["M"] > 256:
            rows = [(256, 8, 4, 4, 4, 8), (128, 8, 5, 4, 4, 8), (256, 8, 3, 16, 16, 8)]
        return [
            dict(block_m=128, block_k=64, group_m=8, prefetch_k=0, **dict(zip(fields, r, strict=True)))
            for r in rows
        ]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        reason = super().check(key, target, params)
        if reason is not None:
            return reason
        from autotaxer.kernels._ag_fused import FusedConfig
        from autotaxer.kernels.ag_gemm_push_ws import ws_config
        from autotaxer.kernels.ag_gemm_ws import ws_config_error

        config = FusedConfig(**params)
        if config.num_warps not in (4, 8):
            return f"num_warps: {config.num_warps} (4: one MMA warpgroup, 8: two)"
        return ws_config_error(ws_config(config))

    def launcher(self):
        from autotaxer.kernels.ag_gemm_push_ws import ag_gemm_push_ws

        return ag_gemm_push_ws


VARIANTS = [PushWsVariant()]
