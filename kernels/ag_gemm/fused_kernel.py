"""The fused ag_gemm kernel (``push``, ``pull``, ``push_tma``): producers (:mod:`.protocol`) and one of two
consumers (:mod:`.consume`, or :mod:`.consume_tma` with ``TMA``) in one persistent launch, keeping the
protocol's synchronisation contract."""

from __future__ import annotations

import triton
import triton.language as tl

from .consume import consume_tiles
from .consume_tma import consume_tiles_tma
from .protocol import begin_call, produce_chunks


@triton.jit
def fused_ag_gemm_kernel(
    io,
    bufs,
    rank,
    sizes,
    chunks,
    strides,
    programs,
    LAYOUT: tl.constexpr,
    TILES: tl.constexpr,
    MOVES: tl.constexpr,
):
    """``C = all_gather(A) @ B`` on one rank: program ids below ``programs.producers`` move the local shard
    (push or pull, :func:`produce_chunks`) and then join the GEMM; the others run it from the start.

    The arguments are the groups of :mod:`.args` (``io``: the call's tensors, ``bufs``: the workspace,
    ``sizes``, ``chunks``, ``strides``, ``programs``; constexpr ``LAYOUT``, ``TILES``, ``MOVES``).
    ``programs.producers == 0``: every program moves its share of the chunks first, then runs its tiles,
    each waiting once for all K chunks of the peers' rows it needs (``WHOLE_K``: one pipelined K loop
    per tile). ``MOVES.STEPS``
    (bits: 1 stage/store, 2 pull's fetch, 4 the GEMM) lets the interpreter run the steps as separate
    launches; every program counts its arrival in the launch that runs the GEMM. ``TILES.TMA`` (push only):
    the GEMM is :func:`consume_tiles_tma`, for which ``EVEN_K``, ``EVEN_N`` and ``PREFETCH_K`` are unused
    (TMA zero-fills edges; no L2 prefetch). For many peers: ``GROUP_ACROSS`` (:func:`tile_group`),
    ``PUSH_ORDER`` and ``RELEASE_EACH`` (:func:`produce_chunks`); 0 is the kernel as first shipped.
    Every wait on a peer's flag gives up after the bound in the watch slot ``bufs.watch``
    (``kernels/common/watch.py``), recorded there, and the program goes on: the kernel always ends.
    """
    pid = tl.program_id(0)
    num_producers = programs.producers
    num_consumers = programs.consumers
    grid = num_producers + num_consumers  # the GEMM launch's grid (the interpreter's earlier steps: fewer)
    epoch, flags, inbox = begin_call(
        bufs.sync, bufs.flags, bufs.inbox, sizes, chunks, grid, LAYOUT.WORLD_SIZE, (MOVES.STEPS & 4) != 0
    )
    dedicated = pid < num_producers
    ok = 1  # 0 once a wait of this program on a peer gave up (``bufs.watch``'s bound): later ones poll once
    if MOVES.STEPS & 3:
        if dedicated | (num_producers == 0):
            movers = tl.where(num_producers > 0, num_producers, num_consumers)
            ok = produce_chunks(
                pid, movers, io.a, inbox, flags, bufs.heap_bases, bufs.watch, rank, epoch, sizes, chunks,
                strides.am, LAYOUT, MOVES,
            )  # fmt: skip
    if MOVES.STEPS & 4:
        # the queue: the low 32 bits of sync[1] (little-endian), drawn in wrapping int32 arithmetic
        queue = (bufs.sync + 1).to(tl.pointer_type(tl.int32))
        # the queue's value at this call's start, folded into the offset the drawn values are added to
        tiles = tl.cdiv(sizes.M, TILES.BLOCK_M) * tl.cdiv(sizes.N, TILES.BLOCK_N)
        drawn_before = (epoch - 1) * (tiles + num_producers)
        offset = num_consumers
        if not TILES.WHOLE_K:  # dedicated producers join through the queue (else tiles are dealt statically)
            offset = num_consumers - drawn_before
        if dedicated:  # done moving: take tiles from the queue like a consumer between tiles
            first_tile = offset + tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
        else:
            first_tile = pid - num_producers
        call = (queue, inbox, flags, bufs.watch, rank, epoch)
        if TILES.TMA:
            tl.static_assert(not MOVES.PULL, "push_tma: push transport only")
            consume_tiles_tma(first_tile, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
        else:
            consume_tiles(first_tile, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
