"""``push_ws``: ``push``'s transfer beside a warp-specialised Gluon GEMM (NVIDIA sm_90 only).

The producers are ``push``'s kernel (its producer steps alone, on a side stream, ``comm_sms`` CTAs) or,
with ``comm_sms=0``, the GEMM's own CTAs before their tiles. The GEMM is
``kernels/ag_gemm/experimental/ws.py``: one load warp per CTA waits for each peer chunk's flag right before
the TMA loads that read it, so no MMA
warp ever waits and the K loop never drains at a chunk boundary (the per-chunk waits of
``push``/``push_tma`` sit in the MMA warps' own loop). Same heap buffers as ``push``. Calls whose
tensors TMA cannot address run ``push``'s kernel with the same parameters instead (same buffers, the
epoch kept in step). ``num_warps`` 8 means two MMA warpgroups, 4 one.

``push_ws_fwd`` (two ranks) has no producer: the same GEMM's forward warp sends each box of the local
shard that a local tile loads, from the ring slot into the peer's inbox.

Measured on 2×H200 only: each holds one record of the shipped ws2 graph table (``gather_dim=1``, M=256
and 512; ``bench/results/2026-11-22_push_ws_tune_ws2/``, ``2026-11-22_push_ws_fwd/``).
"""

from __future__ import annotations

import functools
from typing import Any

from ...._problem import ProblemKey, Target
from ...._target import sm_version
from ..._base import Params
from .._op import shard_shape
from .._space import PUSH_WS_SPACE, fwd_boxes, push_ws_fwd_seeds, push_ws_seeds
from ..iris_fused import PushVariant


class PushWsVariant(PushVariant):
    name = "push_ws"
    experimental = True  # opt-in (``--variants``) until measured on two GPUs

    def unavailable_reason(self, target: Target) -> str | None:
        reason = super().unavailable_reason(target)
        if reason is not None:
            return reason
        if target.is_amd or sm_version(target.arch) != 90:
            return f"{self.name}: Hopper's wgmma and TMA (sm_90) only, this is {target.arch}"
        try:
            from triton.experimental import gluon  # noqa: F401
        except Exception as exc:
            return f"{self.name}: cannot import triton's Gluon ({type(exc).__name__}: {exc})"
        return None

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {**super().search_space(key, target), **PUSH_WS_SPACE}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Four producers pushing 4 row x 8 K chunks, 128x128 tiles up to M=256, 128x256 above
        (:data:`._space.PUSH_WS_SEEDS`)."""
        return push_ws_seeds(key)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        reason = super().check(key, target, params)
        if reason is not None:
            return reason
        from autotaxer.kernels.ag_gemm.experimental.push_ws import ws_config
        from autotaxer.kernels.ag_gemm.experimental.ws import ws_config_error
        from autotaxer.kernels.ag_gemm.fused import FusedConfig

        config = FusedConfig(**params)
        if config.num_warps not in (4, 8):
            return f"num_warps: {config.num_warps} (4: one MMA warpgroup, 8: two)"
        return ws_config_error(ws_config(config))

    def launcher(self):
        from autotaxer.kernels.ag_gemm.experimental.push_ws import ag_gemm_push_ws

        return ag_gemm_push_ws

    def run_for_backward(self, ws, inputs, ctx):
        """None: its launches count arrivals on their own grids, so the inbox slot of a call is not
        ``push``'s; autograd runs the baseline."""
        return None


class PushWsFwdVariant(PushWsVariant):
    """``push_ws`` with no producer at all: the consumer's forward warp TMA-stores each box of the local
    shard that a local tile has just loaded into the peer's inbox (two ranks). One flag per box
    (``row_chunks`` = the shard's 128-row blocks, ``k_chunks`` = its 64-column steps); gather_dim=1 only
    where the tiles fit one wave (every tile there both forwards and waits)."""

    name = "push_ws_fwd"
    experimental = True  # opt-in until measured on two GPUs

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        row_chunks, k_chunks = fwd_boxes(key)
        space = {**super().search_space(key, target), "comm_sms": (0,), "group_m": (8, 1)}
        return {**space, "row_chunks": (row_chunks,), "k_chunks": (k_chunks,)}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """``push_ws``'s tiles, tile groups of 8 or 1 (:data:`._space.PUSH_WS_FWD_SEEDS`)."""
        return push_ws_fwd_seeds(key)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        reason = super().check(key, target, params)
        if reason is not None:
            return reason
        from autotaxer.kernels.ag_gemm.experimental.push_ws import ws_config
        from autotaxer.kernels.ag_gemm.experimental.ws import forward_error
        from autotaxer.kernels.ag_gemm.fused import FusedConfig, geometry

        if key.world_size != 2:
            return f"world_size: {self.name} forwards to one peer (2 ranks), not {key.world_size}"
        config = FusedConfig(**params)
        if config.comm_sms:
            return f"comm_sms: {config.comm_sms} (the consumer forwards the shard itself: 0)"
        geo = geometry(config, *shard_shape(key))
        tiles = -(-key["M"] // config.block_m) * -(-key["N"] // config.block_n)
        why = forward_error((geo.row_width, geo.n_row, geo.col_width, geo.n_col), ws_config(config),
                            key["gather_dim"], tiles, target.num_sms)  # fmt: skip
        return None if why is None else f"row_chunks/k_chunks/M: {why}"

    def launcher(self):
        from autotaxer.kernels.ag_gemm.experimental.push_ws import ag_gemm_push_ws

        return functools.partial(ag_gemm_push_ws, transport="forward")


VARIANTS = [PushWsVariant(), PushWsFwdVariant()]
