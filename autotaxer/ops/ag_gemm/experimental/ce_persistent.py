"""``ce_persistent``: the copy engine moves every peer's rows (0 SMs for communication), one persistent
Triton GEMM consumes them, each tile waiting on the arrival flag of the chunk its rows come from (issue 47).

Where ``copy_engine`` / ``ce_fanout`` run one vendor GEMM per peer chunk (at 4 ranks each a quarter of M,
with its own launch and tail), this runs one launch over all of ``C``'s tiles: the local shard's rows
first (no copy, no wait), then the peers' in the order they land (rank-rotated: every rank sends to
``r-1`` first). The GEMM is the fused kernels' consumer (``push``'s ``cp.async`` loop, or ``push_tma``'s
TMA loop with ``tma=1``), so its tiles are the tuner's, not cuBLAS'. Both ``gather_dim`` values and
both ``b_layout`` values run.

Parameters: ``block_m``/``block_n``/``block_k``, ``group_m``, ``num_warps``, ``num_stages`` (the GEMM),
``chunks`` per peer shard (one copy and one flag each), ``streams`` (side streams the peers are dealt to),
``tma`` (1: TMA loads, sm_90+, gather_dim=0 shards of whole row tiles), ``signal`` (the flags: ``triton``
epoch kernels, the issue's design, or ``memop`` stream-memop tokens), ``order`` (0: a peer's chunks sent and
its tiles taken one peer after another; 1, gather_dim=0: both chunk by chunk across the peers, the fourth seed
from 3 ranks on, with a side stream a peer), ``poll`` (how the tiles read their flags: 0 an acquire atomic,
the kernel as first shipped; 1 ``ld.acquire.sys``; 2 that load with a ``nanosleep`` between polls; the second
seed is the first with 1, the A/B for the 4-GPU runs; on one H200 with four ranks emulated,
``bench/results/2026-11-28_rank0_view_h200``, no stall); the third seed, where the first one's tile groups
span a shard's chunks, is the second with groups inside a chunk (:func:`chunk_group_seed`: a wider group waits
for the shard's last chunk; ``bench/results/2026-11-29_ce_arrivals_h200``). Experimental: its first 4-GPU run
stalled (1.1-114 ms a call at 6 of its 8 keys), which the kernel's hazard (5) addresses: its waits read their
bound once, and since 2026-11-29 only after 10 ms (on one H200 with four ranks emulated and gated, 199-246 µs
a call at M=1024 N=2560 instead of 507-704, ``bench/results/2026-11-29_bound_reads_h200``); not yet measured
again on GPUs (checked on 2, 4 and 8 ranks emulated under Triton's interpreter and, compiled, on one H200 with
each emulated rank on its share of the SMs, ``bench/results/2026-11-29_emulated_share_sms_h200``); tuned only
when named with ``--variants``. NVIDIA only (``cuMemcpyAsync``); see
``autotaxer.kernels.ag_gemm.experimental.ce_persistent`` for the schedule and its hazards.
"""

from __future__ import annotations

from typing import Any

from ...._problem import ProblemKey, Target, torch_dtype
from ...._target import tma_unavailable
from ..._base import Params, RunContext, Workspace
from ..._copy_engine import CopyEngineBase, channel_buffers, transport_error
from ..iris_fused import _ELEM_BYTES, _SMEM_BYTES, _next_pow2  # the fused variants' sizing rules

#: The search space, most decisive first; the first value of each is the safe default.
SPACE: dict[str, tuple[Any, ...]] = {
    "block_m": (128, 64, 32, 16),
    "block_n": (256, 128),
    "block_k": (64, 128),
    "group_m": (8, 4, 2, 1),
    "num_warps": (8, 4),
    "num_stages": (3, 4, 5),
    "chunks": (4, 1, 2, 8, 16),
    "streams": (1, 2, 4, 8),
    "tma": (1, 0),
    "signal": ("triton", "memop"),
    "poll": (0, 1, 2),
    "order": (0, 1),
}
#: Seeds: cuBLAS-class tilings on H100/H200 (128x256x64 on 8 warps, 3 stages; 128x128x64 on 4 warps,
#: 4 stages), TMA first; the copies in 4 chunks per peer shard (fewer where the shard is smaller).
SEED_TILES: tuple[tuple[int, int, int, int, int], ...] = ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4))
SEED_CHUNKS = (4, 2, 1)
#: Seeds' transports: (side streams: ``one`` or ``each`` peer its own, flags' back end), the issue's
#: design first (epoch flags on one stream), then stream memops (no flag kernel: less host time).
SEED_TRANSPORTS = (("one", "triton"), ("one", "memop"), ("each", "memop"), ("each", "triton"))
#: Parameters a configuration may leave out, at these values (those tuned before they existed).
OPTIONAL: dict[str, Any] = {"poll": 0, "order": 0}
#: The read of the tiles' flags the second seed tries (``load``: ``ld.acquire.sys``, see ``poll`` above).
SEED_POLL = 1
#: Group sizes a seed whose tile groups stay inside one chunk picks from, largest first.
CHUNK_GROUPS = (4, 2, 1)
#: Shared memory of one CTA on H100/H200 (the fused variants' budget).
SMEM_BYTES = _SMEM_BYTES["nvidia"]


def _gemm_fields(params: Params) -> dict[str, Any]:
    """The kernel config's fields of ``params`` (all but the flags' back end, the channel's)."""
    return {f: v for f, v in params.items() if f != "signal"}


def _shard_rows(key: ProblemKey) -> int:
    return key["M"] // key.world_size if key["gather_dim"] == 0 else key["M"]


def ce_persistent_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """:data:`SPACE` (the same at every key; :meth:`CePersistentVariant.check` prunes it)."""
    return dict(SPACE)


def ce_persistent_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """:data:`SEED_TILES` with TMA, then without, each with the most of :data:`SEED_CHUNKS` that cuts the
    shard into that many chunks (row tiles no taller than M needs), over :data:`SEED_TRANSPORTS`."""
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import chunk_width, uniform_rows

    lanes = min(8, _next_pow2(max(1, key.world_size - 1)))  # a side stream per peer
    transports = dict.fromkeys((1 if s == "one" else lanes, signal) for s, signal in SEED_TRANSPORTS)
    seeds = []
    for tma in (1, 0):
        for bm, bn, bk, warps, stages in SEED_TILES:
            bm = min(bm, max(16, _next_pow2(key["M"])))  # small M: the rows it has
            rows = _shard_rows(key)
            chunks = next(
                (c for c in SEED_CHUNKS if len(uniform_rows(rows, chunk_width(rows, c, bm))) == c), 1
            )
            for s, signal in transports:
                seeds.append(
                    {"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8, "num_warps": warps,
                     "num_stages": stages, "chunks": chunks, "streams": s, "tma": tma, "signal": signal,
                     "poll": 0, "order": 0}
                )  # fmt: skip
    if not seeds:
        return seeds
    # the first seed's flags read by ld.acquire, second: the A/B of the tiles' read in one run; third,
    # where the first seed's groups span chunks, that seed with groups inside a chunk; fourth (3+ ranks),
    # that one with a side stream a peer and the tiles chunk by chunk across the peers (order 1)
    first = seeds[0]
    by_load = {**first, "poll": SEED_POLL}
    grouped = chunk_group_seed(key, by_load)
    dealt = [{**grouped, "streams": lanes, "order": 1}] if grouped and key.world_size > 2 else []
    return [first, by_load, *([grouped] if grouped else []), *dealt, *seeds[1:]]


def chunk_group_seed(key: ProblemKey, seed: dict[str, Any]) -> dict[str, Any] | None:
    """``seed`` with its tile groups inside one chunk (the largest of :data:`CHUNK_GROUPS` dividing a
    chunk's row tiles), or None where its groups already are, or no group could be (``gather_dim=1``:
    chunks cut K; one chunk a shard; chunks shorter than a tile row).

    The tiles run in grouped order, a group's rows first: with ``group_m=8`` over a 1024-row shard in
    four chunks, a shard's first tiles need all four, so its tiles wait for its last chunk. On one H200,
    four ranks emulated, rows landing by copy engine one shard after another (``bench/rank0_view.py
    --source host``, M=4096 N=14336 K=8192 ``nk``, 2026-11-29): rank 0's GEMM took 1.19x the larger of the
    GEMM alone and the copies alone with ``group_m=8`` and 1.04x with 2, whose GEMM alone is 12% slower
    (less reuse of B in L2); at N=2560, where the copies outlast the GEMM, the GEMM alone is as fast either
    way and the call took 8% less."""
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import chunk_width

    if key["gather_dim"] != 0 or seed["chunks"] == 1:
        return None
    rows, bm = _shard_rows(key), seed["block_m"]
    tiles = chunk_width(rows, seed["chunks"], bm) // bm
    spanned = min(seed["group_m"], max(rows // bm, 1))  # the kernel's group: never wider than a shard
    if tiles == 0 or (spanned <= tiles and tiles % spanned == 0):  # a tile spans chunks, or groups fit
        return None
    return {**seed, "group_m": next(g for g in CHUNK_GROUPS if g <= tiles and tiles % g == 0)}


class CePersistentVariant(CopyEngineBase):
    """The copy engine's transfer and one persistent GEMM waiting per tile (the module docstring)."""

    name = "ce_persistent"
    experimental = True
    space_of = staticmethod(ce_persistent_space)
    seeds_of = staticmethod(ce_persistent_seeds)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """:func:`ce_persistent_seeds` that :meth:`check` keeps at ``key`` on ``target``."""
        return [s for s in ce_persistent_seeds(key) if self.check(key, target, s) is None]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        """Why ``params`` cannot serve ``key`` on ``target``, else None (the transport's rules, the GEMM's
        tiles, chunks that each cut the shard differently, side streams that deal the peers differently,
        TMA where the tensors allow it)."""
        from autotaxer.kernels.ag_gemm.experimental.ce_persistent import (
            CePersistentConfig,
            chunk_major_error,
            chunk_width,
            uniform_rows,
        )
        from autotaxer.kernels.common.gemm import register_error, smem_error
        from autotaxer.kernels.common.lanes import _streams_reason

        missing = set(SPACE) - set(params) - set(OPTIONAL)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        reason = transport_error(self.name, key, params["signal"])
        if reason is not None:
            return reason
        try:
            config = CePersistentConfig(**_gemm_fields(params))
            config.validate()
        except (TypeError, ValueError) as exc:
            return str(exc)
        gd, m, k, ws = key["gather_dim"], key["M"], key["K"], key.world_size
        if gd not in (0, 1) or (m if gd == 0 else k) % ws:
            return "shape: not divisible by the world size"
        if config.block_m > max(16, _next_pow2(m)):
            return f"block_m: {config.block_m} is larger than M={m} needs"
        reason = register_error(config) or smem_error(config, _ELEM_BYTES[key.dtype], SMEM_BYTES)
        if reason is not None:
            return reason
        rows = _shard_rows(key)
        made = len(uniform_rows(rows, chunk_width(rows, config.chunks, config.block_m)))
        if made != config.chunks:
            return f"chunks: {config.chunks} chunks of a {rows}-row shard give {made} (a smaller count's cut)"
        reason = _streams_reason(config.streams, ws - 1)
        if reason is not None:
            return reason
        if config.order == 1:
            if gd != 0:
                return "order: 1 deals a shard's row tiles to the peers in turn (gather_dim=0 only)"
            if config.chunks == 1:
                return "order: 1 with one chunk a shard takes the tiles as 0 does"
            reason = chunk_major_error(rows, config)
            if reason is not None:
                return reason
        if config.tma:
            reason = tma_unavailable(self.name, target)
            if reason is not None:
                return f"tma: {reason}"
            if gd == 0 and rows % config.block_m:
                return f"tma: {config.block_m}-row tiles straddle {rows}-row shards (TMA reads one owner)"
            ks = k if gd == 0 else k // ws
            if ks * _ELEM_BYTES[key.dtype] % 16:
                return "tma: a shard row is not a multiple of 16 bytes"
        return None

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.experimental.ce_persistent import (
            SYNC_WORDS,
            CePersistentConfig,
            make_persistent_plan,
        )

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        config = CePersistentConfig(**_gemm_fields(params))

        def plan(channel: Any, elem: int) -> Any:
            return make_persistent_plan(
                channel, m=key["M"], n=key["N"], k=key["K"], gather_dim=key["gather_dim"], elem=elem,
                config=config, num_sms=ctx.target.num_sms,
            )  # fmt: skip

        buffers = channel_buffers(self.name, key, params, ctx, plan)  # the channel of params["signal"]
        buffers["sync"] = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=ctx.device)
        buffers["token"] = torch.ones(1, dtype=torch.int32, device=ctx.device)  # what a memop flag holds
        buffers["cache"] = {}  # compiled launches, by the call's tensors
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.ag_gemm.experimental.ce_persistent import ag_gemm_ce_persistent

        a_shard, b = inputs
        a_shard = a_shard.contiguous()  # the peer copies move whole rows; B may be kn or nk
        if out is None:
            out = torch.empty(
                (ws.key["M"], ws.key["N"]), dtype=torch_dtype(ws.key.dtype), device=a_shard.device
            )
        buf = ws.buffers
        return ag_gemm_ce_persistent(
            buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf["sync"],
            watch=buf["watch"].tensor, cache=buf["cache"], token=buf["token"],
        )  # fmt: skip


VARIANTS = [CePersistentVariant()]
