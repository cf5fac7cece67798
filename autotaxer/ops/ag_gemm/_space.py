"""The fused ``ag_gemm`` variants' (``push``, ``pull``, ``push_tma``) search space and seed configurations,
as data: what the tuner explores, and what it and the benchmark try first. Light: no torch, Triton or Iris
imports. Each value says where it was measured; the variants' modules only read these tables.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from ._op import shard_shape

#: Largest M that is "small": the GEMM is bound by reading B, so many narrow tiles, K chunks to start
#: early and deeper pipelines (bytes in flight) are worth exploring.
SMALL_M = 256

#: Choices per parameter as ``(small M, larger M)``; the first choice of each is the safe default.
FUSED_SPACE: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {
    "block_m": ((128, 64, 32, 16), (128, 64, 32, 16)),
    "block_n": ((64, 128, 256), (256, 128, 64)),
    "block_k": ((64, 128, 256), (64, 128)),
    "group_m": ((8, 4), (8, 4)),
    "num_warps": ((8, 4), (8, 4)),
    # deeper pipelines at small M: 128x128x64 on 4 warps, one H100 at one rank, M=256: 62.6 against
    # 58.3 us with 4 and 5 stages in one call, 59.0 against 56.9 with 5 and 6 in the next
    # (bench/results/2026-11-25_gemm_core_h100/)
    "num_stages": ((3, 4, 2, 5, 6), (3, 4, 2)),
    "comm_sms": ((16, 8, 32, 4, 0), (16, 8, 32, 4, 0)),  # 0: every program moves its share, then computes
    # many row chunks per producer (large M): the first wave's rows land first
    "row_chunks": ((4, 1, 8, 16), (4, 1, 8, 16, 32, 64)),
    "k_chunks": ((4, 2, 1, 8), (1, 2, 4, 8)),
}
#: The L2 prefetch of B's rows: explored at small M and gather_dim=0 only (the tiles that wait first).
PREFETCH_K = (0, 1024)
#: ``push_tma``'s pipelines (6 at small M for ``push``'s reason); it has no L2 prefetch.
PUSH_TMA_STAGES = ((4, 3, 5, 6), (4, 3, 5))

#: Seeds' fields, in the order of the rows below; the fields not listed take :data:`SEED_DEFAULTS`.
SEED_FIELDS = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "comm_sms", "row_chunks",
               "k_chunks")  # fmt: skip
SEED_DEFAULTS = {"group_m": 8, "prefetch_k": 0, "group_across": 0, "push_order": 0, "release_each": 0}

#: ``push``/``pull`` seeds above :data:`ONE_ROW_TILE_M`, best first (the tuner may run only the first few):
#: rows of (largest M, seeds). 128x128 tiles beat 128x256 in the fused kernel at M=1024-4096 on 2xH200.
#: Up to M=256 first no dedicated producers (``comm_sms=0``, the shard cut fine enough that many programs
#: move a piece each), last the same with six pipeline stages (one H100, one rank, M=256: a GEMM core 9%
#: faster than with four); from M=512, where the grid runs more than one wave, first 8-16 dedicated
#: producers that join the GEMM when done, the shard cut in many row chunks so the rows of the first
#: wave land first (2xH200, N=K=8192: 1.05-1.14x faster than ``comm_sms=0`` at M=1024-4096).
FUSED_SEEDS: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...] = (
    (256, (
        (128, 128, 64, 4, 4, 0, 16, 8),
        (128, 128, 64, 4, 4, 4, 4, 2),
        (128, 128, 64, 4, 4, 4, 4, 4),
        (128, 128, 64, 4, 6, 0, 16, 8),
    )),
    (512, (
        (128, 128, 64, 4, 4, 16, 16, 1),
        (128, 128, 64, 4, 4, 0, 16, 8),
        (128, 128, 64, 4, 4, 4, 4, 2),
    )),
    (None, (
        (128, 128, 64, 4, 4, 16, 64, 1),
        (128, 128, 64, 4, 4, 8, 64, 1),
        (128, 256, 64, 8, 3, 16, 64, 1),
    )),
)  # fmt: skip
#: Up to this M one row tile covers every row (B is read once): see :func:`_one_row_tile_seeds`.
ONE_ROW_TILE_M = 64

#: ``push_tma`` seeds from M=256 (below: ``push``'s, without the prefetch): ``push``'s 128x128 tiles and
#: the 128x256 tiles (one wave of 8 warps at M=512 on 2 GPUs) TMA makes affordable, at 3 stages (one rank,
#: 2xH200: 99.7 against 107.4 us at M=512 with 4); at M=256 also 128x128 tiles at 6 stages (one rank,
#: one H100: 57.5 against 60.7 us with 5 in one call; 59.8 with 5 against 63.2 with 4 in another).
PUSH_TMA_SEEDS: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...] = (
    (255, ()),  # push's seeds
    (256, (
        (128, 256, 64, 8, 3, 0, 16, 8),
        (128, 128, 64, 4, 4, 0, 16, 8),
        (128, 128, 64, 4, 5, 16, 64, 1),
        (128, 128, 64, 4, 6, 0, 16, 8),
    )),
    (512, (
        (128, 256, 64, 8, 3, 0, 16, 8),
        (128, 128, 64, 4, 4, 0, 16, 8),
        (128, 128, 64, 4, 5, 16, 64, 1),
    )),
    (None, (
        (128, 256, 64, 8, 3, 0, 16, 8),
        (128, 128, 64, 4, 5, 16, 64, 1),
        (128, 256, 64, 8, 3, 16, 64, 1),
    )),
)  # fmt: skip

#: Many peers (3+ ranks): dedicated producers of the second many-peer seed, at most (8 ranks: 16 -> 8
#: producers cost 47-94 us on 8xH200, and each chunk goes to 7 peers).
MANY_PEERS_MAX_PRODUCERS = 32


def fused_space(key: ProblemKey, pushes: bool) -> dict[str, tuple[Any, ...]]:
    """The fused variants' search space at ``key`` (``pushes``: push's transport, where the peer order
    and the per-peer release apply)."""
    small = key["M"] <= SMALL_M
    space = {name: choices[0 if small else 1] for name, choices in FUSED_SPACE.items()}
    gather_rows = key["gather_dim"] == 0
    many = key.world_size > 2  # one value at 2 ranks, where the orders coincide and a chunk has one peer
    space["prefetch_k"] = PREFETCH_K if small and gather_rows else (0,)
    space["group_across"] = (0, 1) if gather_rows and many else (0,)  # gather_dim=0 groups over all of M
    space["push_order"] = (0, 1) if pushes and many else (0,)
    space["release_each"] = (0, 1) if pushes and many else (0,)
    return space


def push_tma_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``push_tma``'s space: push's with its own pipelines and no L2 prefetch."""
    space = fused_space(key, pushes=True)
    space["num_stages"] = PUSH_TMA_STAGES[0 if key["M"] <= SMALL_M else 1]
    space["prefetch_k"] = (0,)
    return space


def _seed(row: tuple[int, ...], **fields: int) -> dict[str, int]:
    return {**dict(zip(SEED_FIELDS, row, strict=True)), **SEED_DEFAULTS, **fields}


def _by_m(table: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...], m: int) -> list[dict[str, int]]:
    for largest, rows in table:
        if largest is None or m <= largest:
            return [_seed(row) for row in rows]
    raise AssertionError("the last row of a seed table serves every M")


def _one_row_tile_seeds(key: ProblemKey, target: Target) -> list[dict[str, int]]:
    """Up to :data:`ONE_ROW_TILE_M`: one row tile over all of M (64 wide at gather_dim=0, where deeper
    searches found narrow tiles best), first with no dedicated producers, then 8; the third prefetches
    B's rows where gather_dim=0 tiles wait first (NVIDIA), else cuts the shard in two K chunks."""
    m, gd = key["M"], key["gather_dim"]
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    shard_rows = m // key.world_size if gd == 0 else m
    prefetch = gd == 0 and not target.is_amd  # only gather_dim=0 tiles wait first; NVIDIA PTX
    return [
        _seed((bm, 64 if gd == 0 else 128, 128, 4, 4, 0, 4 if shard_rows >= 4 else 1, 8)),
        _seed((bm, 128, 128, 4, 4, 8, 4, 1)),
        _seed((bm, 128, 128, 4, 4, 8, 4, 1), prefetch_k=1024)
        if prefetch
        else _seed((bm, 128, 128, 4, 4, 8, 1, 2)),
    ]


def many_peers(key: ProblemKey, seeds: list[dict[str, Any]], pushes: bool) -> list[dict[str, Any]]:
    """At 3+ ranks, after the first seed: the same with the many-peer schedule (push in the order the
    peers read, each peer's flag released after its copy, gather_dim=0 tiles grouped over the whole M)
    and, where producers are dedicated, twice as many of them (at most
    :data:`MANY_PEERS_MAX_PRODUCERS`)."""
    if key.world_size <= 2 or not seeds:
        return seeds
    first = seeds[0]
    wide = dict(first, group_across=int(key["gather_dim"] == 0))
    if pushes:
        wide.update(push_order=1, release_each=1)
    extra = [wide]
    if first["comm_sms"]:
        extra.append(dict(wide, comm_sms=min(2 * first["comm_sms"], MANY_PEERS_MAX_PRODUCERS)))
    return [first, *extra, *seeds[1:]]


def fused_seeds(key: ProblemKey, target: Target, pushes: bool) -> list[dict[str, Any]]:
    """``push``'s and ``pull``'s seeds at ``key``, best first."""
    m = key["M"]
    seeds = _one_row_tile_seeds(key, target) if m <= ONE_ROW_TILE_M else _by_m(FUSED_SEEDS, m)
    return many_peers(key, seeds, pushes)


def push_tma_seeds(key: ProblemKey, target: Target) -> list[dict[str, Any]]:
    """``push_tma``'s seeds at ``key``, best first: :data:`PUSH_TMA_SEEDS`, or below M=256 ``push``'s
    without the prefetch."""
    seeds = _by_m(PUSH_TMA_SEEDS, key["M"])
    if not seeds:
        return [dict(c, prefetch_k=0) for c in fused_seeds(key, target, pushes=True)]
    return many_peers(key, seeds, pushes=True)


# -- the copy-engine schedules (copy_engine, ce_fanout, ce_grouped) ----------------------------------------

#: ``copy_engine``: chunks per peer shard.
CE_CHUNKS = (1, 2, 4, 8)
#: Largest M whose ``copy_engine`` seeds wait for every peer and run one GEMM (``gather_first``).
CE_GATHER_FIRST_M = 256
#: ``copy_engine`` seeds, the 2xH200 tuning run's usual winners: one chunk (two at large M), stream memops.
CE_SEEDS = (("memop", 1), ("memop", 2), ("triton", 1))
#: The flags' back ends: stream memory operations (NVIDIA) or 1-program Triton kernels.
CE_SIGNALS = ("memop", "triton")
#: ``ce_fanout``/``ce_grouped``: side streams the peers are dealt to (at most one per peer counts).
CE_STREAMS = (8, 4, 2, 1)
#: ``ce_fanout``: chunks per peer shard (a copy-engine copy costs about 16 µs however small).
CE_FANOUT_CHUNKS = (1, 2, 4)
#: ``ce_grouped``: consecutive peers per GEMM.
CE_GROUPS = (8, 4, 2, 1)


def copy_engine_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``copy_engine``'s space, the most decisive parameter first (a capped sweep spread over the grid then
    covers it)."""
    gd = key["gather_dim"]
    return {
        "gather_first": (False, True) if gd == 0 else (False,),
        "signal": CE_SIGNALS,
        "chunks": CE_CHUNKS,
        "accumulate": ("out",) if gd == 0 else ("out", "fp32"),
        "order": ("rotated",) if key.world_size <= 2 else ("rotated", "reverse"),
    }


def copy_engine_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """:data:`CE_SEEDS` at ``key``: up to :data:`CE_GATHER_FIRST_M` at gather_dim=0, one GEMM after every
    peer's copy."""
    gather_first = key["gather_dim"] == 0 and key["M"] <= CE_GATHER_FIRST_M
    return [
        {"gather_first": gather_first, "signal": s, "chunks": c, "accumulate": "out", "order": "rotated"}
        for s, c in CE_SEEDS
    ]


def ce_fanout_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``ce_fanout``'s space: lanes, one GEMM per run of peers or per peer (``range``: gather_dim=0
    only), the flags' back end, chunks and (gather_dim=1) the accumulation."""
    gd = key["gather_dim"]
    return {
        "streams": CE_STREAMS,
        "gemms": ("range", "peer") if gd == 0 else ("peer",),
        "signal": CE_SIGNALS,
        "chunks": CE_FANOUT_CHUNKS,
        "accumulate": ("out",) if gd == 0 else ("out", "fp32"),
    }


def ce_grouped_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``ce_grouped``'s space: peers per GEMM, lanes, the flags' back end and (gather_dim=1) the
    accumulation."""
    accumulate = ("out",) if key["gather_dim"] == 0 else ("out", "fp32")
    return {"group": CE_GROUPS, "streams": CE_STREAMS, "signal": CE_SIGNALS, "accumulate": accumulate}


def _stream_counts(key: ProblemKey) -> list[int]:
    """The side-stream counts of :data:`CE_STREAMS` that deal ``key``'s peers differently, most first."""
    from autotaxer.kernels.common.lanes import _streams_reason

    return [s for s in CE_STREAMS if _streams_reason(s, key.world_size - 1) is None]


def ce_fanout_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """Every peer on a stream of its own (up to 8 streams), then half as many streams; one copy per peer,
    stream memops, one GEMM per run of peers at gather_dim=0."""
    gemms = "range" if key["gather_dim"] == 0 else "peer"
    base = {"gemms": gemms, "signal": "memop", "chunks": 1, "accumulate": "out"}
    return [{"streams": s, **base} for s in _stream_counts(key)[:2]]


def ce_grouped_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """Every peer on a stream of its own; GEMMs of half the peers (B read three times, the first GEMM after
    half the copies), then of every contiguous run. the cost model (issue 26) puts these two first at 8 GPUs
    (groups of 2 lose there: one more GEMM launch and B read per pair)."""
    peers = key.world_size - 1
    half = 1 << max(0, (peers + 1) // 2 - 1).bit_length()  # the power of two covering half the peers
    every = next(g for g in reversed(CE_GROUPS) if g >= peers)
    base = {"streams": _stream_counts(key)[0], "signal": "memop", "accumulate": "out"}
    return [{"group": g, **base} for g in dict.fromkeys((half, every))]


# -- push_ws and push_ws_fwd (experimental: the warp-specialised Gluon consumer) ---------------------------

#: ``push_ws``: choices replacing ``push``'s; comm_sms 0: the consumer CTAs move the shard first (no
#: producer kernel); the many-peer schedule is ``push``'s kernel's, not the Gluon consumer's.
PUSH_WS_SPACE: dict[str, tuple[Any, ...]] = {
    "block_m": (128,),
    "block_n": (256, 128),
    "block_k": (64,),
    "num_warps": (8, 4),
    "num_stages": (4, 3, 5, 6),
    "comm_sms": (4, 0, 2, 8, 16),
    "prefetch_k": (0,),
    "group_across": (0,),
    "push_order": (0,),
    "release_each": (0,),
}
#: ``push_ws`` seeds' fields (the others: 128x64 tiles' ``block_m``/``block_k``, :data:`SEED_DEFAULTS`).
PUSH_WS_FIELDS = ("block_n", "num_warps", "num_stages", "comm_sms", "row_chunks", "k_chunks")
#: ``push_ws`` seeds up to M=256 and above: four producer CTAs (the consumer keeps one wave of 128 tiles on
#: 128 SMs; 2xH200, N=K=8192, graph: 4 beat 8 at M = 256-512 and at gather_dim=0 M=1024) pushing 4 row x
#: 8 K chunks, with 128x128 tiles on two MMA warpgroups up to M=256 and 128x256 tiles above; 16 producers
#: for the largest shards (gather_dim=1 M=4096: 930 against 1126 us with 4).
PUSH_WS_SEEDS: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...] = (
    (256, ((128, 8, 5, 4, 4, 8), (128, 4, 6, 4, 4, 8), (128, 8, 5, 8, 4, 8))),
    (None, ((256, 8, 4, 4, 4, 8), (128, 8, 5, 4, 4, 8), (256, 8, 3, 16, 16, 8))),
)
#: ``push_ws_fwd`` seeds' fields: ``push_ws``'s tiles (128x128 on two MMA warpgroups up to M=256, 128x256
#: above), tile groups of 8 (local and peer tiles reading the same columns of B side by side) or 1 (all
#: local tiles first); no producers, one flag per 128x64 box.
PUSH_WS_FWD_FIELDS = ("block_n", "num_warps", "num_stages", "group_m")
PUSH_WS_FWD_SEEDS: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...] = (
    (256, ((128, 8, 5, 8), (128, 8, 5, 1), (128, 4, 6, 8))),
    (None, ((256, 8, 4, 8), (256, 8, 4, 1), (128, 8, 5, 8))),
)
#: ``push_ws_fwd``'s boxes: one flag per ``FWD_BOX`` of a rank's shard (rows x K columns).
FWD_BOX = (128, 64)


def _ws_seeds(table: tuple[tuple[int | None, tuple[tuple[int, ...], ...]], ...], fields: tuple[str, ...],
              m: int, **fixed: int) -> list[dict[str, int]]:  # fmt: skip
    rows = next(rows for largest, rows in table if largest is None or m <= largest)
    return [{"block_m": 128, "block_k": 64, **SEED_DEFAULTS, **fixed, **dict(zip(fields, r, strict=True))}
            for r in rows]  # fmt: skip


def push_ws_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """:data:`PUSH_WS_SEEDS` at ``key``."""
    return _ws_seeds(PUSH_WS_SEEDS, PUSH_WS_FIELDS, key["M"])


def fwd_boxes(key: ProblemKey) -> tuple[int, int]:
    """``(row_chunks, k_chunks)`` of ``push_ws_fwd``: the shard's :data:`FWD_BOX` rows and K steps."""
    rows, cols = shard_shape(key)
    return -(-rows // FWD_BOX[0]), -(-cols // FWD_BOX[1])


def push_ws_fwd_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """:data:`PUSH_WS_FWD_SEEDS` at ``key``: no producers, one flag per box."""
    row_chunks, k_chunks = fwd_boxes(key)
    return _ws_seeds(PUSH_WS_FWD_SEEDS, PUSH_WS_FWD_FIELDS, key["M"], comm_sms=0, row_chunks=row_chunks,
                     k_chunks=k_chunks)  # fmt: skip
