"""``ce_gemm``: copy-engine peer copies (0 SMs) feeding one persistent Triton GEMM with in-kernel flag waits.

Experimental: built on the copy-engine channel of ``copy_engine`` and the consumer GEMM of
``push``/``pull``. Correct on 2xH200 (GPU tests), but slower there than the better of ``copy_engine``
and ``push`` at every M measured (N=K=8192, both layouts, M 16-4096:
``bench/results/2026-11-22_graph_tables_h200x2/``; again with one copy per peer, M 128-4096:
``bench/results/2026-11-22_consumer_h200x2/``): the consumer GEMM alone, with no communication, runs at
0.86-0.94x of cuBLAS where ``copy_engine``'s chunked cuBLAS calls do not lose that. So the tuner and the
benchmark take it only when named (``--variants ...,ce_gemm``). NVIDIA only (``cuMemcpyAsync``); see
``autotaxer.kernels.ag_gemm_ce_gemm``.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params, RunContext, Variant, Workspace
from .copy_engine import CopyEngineVariant
from .push import PushVariant

_TILE_FIELDS = ("block_m", "block_n", "block_k", "group_m", "num_warps", "num_stages", "prefetch_k")


class CeGemmVariant(Variant):
    name = "ce_gemm"
    experimental = True
    _tiles = PushVariant()  # the GEMM is the fused kernels' consumer: their tile space, checks and seeds

    def unavailable_reason(self, target: Target) -> str | None:
        if target.is_amd:
            return "ce_gemm: copy-engine copies through cuMemcpyAsync are NVIDIA-only (AMD: push/pull)"
        for part in (CopyEngineVariant(), self._tiles):  # its transport and its GEMM must both run here
            reason = part.unavailable_reason(target)
            if reason is not None:
                return f"ce_gemm: {reason}"
        return None

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        tiles = self._tiles.search_space(key, target)
        return {
            **{f: tiles[f] for f in _TILE_FIELDS},
            "chunks": (4, 2, 1, 8),
            "signal": ("memop", "triton"),
        }

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """The push/pull seeds' tiles (one row tile up to M=64, 128x128 to 512, 128x256 above), one copy
        per peer: a copy-engine copy costs about 16 us however small (``ce_copy_probe.json``), so four row
        chunks land later than one (2xH200, N=K=8192, M=256, graph-timed: four chunks 109 / 84 us at
        gather_dim 0 / 1 in ``ce_gemm_probe_n8192.json``, one chunk 89 / 62 us in
        ``ce_gemm_chunks_probe.json``)."""
        seeds = []
        for tile in self._tiles.seed_configs(key, target):
            params = {f: tile[f] for f in _TILE_FIELDS} | {"chunks": 1, "signal": "memop"}
            if params not in seeds:
                seeds.append(params)
        return seeds

    @staticmethod
    def _transport_params(params: Params) -> dict[str, Any]:
        """``copy_engine``'s parameters for this variant's transport (peers' chunks read in place)."""
        return {
            "gather_first": False,
            "signal": params["signal"],
            "chunks": params["chunks"],
            "accumulate": "out",
            "order": "rotated",
        }

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        missing = {*_TILE_FIELDS, "chunks", "signal"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        tile = {f: params[f] for f in _TILE_FIELDS} | {"comm_sms": 1, "row_chunks": 1, "k_chunks": 1}
        reason = self._tiles.check(key, target, tile)
        if reason is not None:
            return reason
        # ranks, signal back end (memop availability), chunks per shard: the transport's own checks
        reason = CopyEngineVariant().check(key, target, self._transport_params(params))
        return None if reason is None else f"copy-engine transport: {reason}"

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from ...kernels._ag_fused import FusedConfig
        from ...kernels.ag_gemm_ce_gemm import uniform_plan

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"ce_gemm params {dict(params)}: {reason}")
        # The transport is copy_engine's: its channel, plan and inbox, peers' chunks read in place.
        transport = CopyEngineVariant().prepare(key, self._transport_params(params), ctx).buffers
        buffers = {
            "channel": transport["channel"],
            "plan": uniform_plan(transport["plan"], params["chunks"]),
            "inbox": transport["inbox"],
            "token": torch.ones(1, dtype=torch.int32, device=ctx.device),
            "config": FusedConfig(
                **{f: params[f] for f in _TILE_FIELDS}, comm_sms=1, row_chunks=1, k_chunks=1
            ),
        }
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from ...kernels.ag_gemm_ce_gemm import ag_gemm_ce_gemm

        a_shard, b = inputs
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        buf = ws.buffers
        return ag_gemm_ce_gemm(
            buf["channel"], buf["plan"], buf["inbox"], buf["token"], a_shard, b, out, buf["config"],
            ctx.target.num_sms,
        )  # fmt: skip


VARIANTS = [CeGemmVariant()]
