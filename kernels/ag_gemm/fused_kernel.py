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
    a_ptr,
    b_ptr,
    c_ptr,
    inbox_ptr,
    flags_ptr,
    sync_ptr,
    heap_bases,
    watch_ptr,
    rank,
    M,
    N,
    K,
    Ms,
    Ks,
    rcw,
    n_rc,
    kcw,
    n_kc,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    num_producers,
    num_consumers,
    WORLD_SIZE: tl.constexpr,
    GATHER_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    P_ROWS: tl.constexpr,
    P_COLS: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    ALIGNED: tl.constexpr,
    STEPS: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    B_ROW_MAJOR: tl.constexpr,
    WHOLE_K: tl.constexpr,
    PULL: tl.constexpr,
    TMA: tl.constexpr = False,
    GROUP_ACROSS: tl.constexpr = False,
    PUSH_ORDER: tl.constexpr = 0,
    RELEASE_EACH: tl.constexpr = False,
):
    """``C = all_gather(A) @ B`` on one rank: program ids below ``num_producers`` move the local shard
    (push or pull, :func:`produce_chunks`) and then join the GEMM; the others run it from the start.

    ``num_producers == 0``: every program moves its share of the chunks first, then runs its tiles,
    each waiting once for all K chunks of the peers' rows it needs (``WHOLE_K``: one pipelined K loop
    per tile). ``STEPS``
    (bits: 1 stage/store, 2 pull's fetch, 4 the GEMM) lets the interpreter run the steps as separate
    launches; every program counts its arrival in the launch that runs the GEMM. ``TMA`` (push only):
    the GEMM is :func:`consume_tiles_tma`, for which ``EVEN_K``, ``EVEN_N`` and ``PREFETCH_K`` are unused
    (TMA zero-fills edges; no L2 prefetch). For many peers: ``GROUP_ACROSS`` (:func:`tile_group`),
    ``PUSH_ORDER`` and ``RELEASE_EACH`` (:func:`produce_chunks`); their defaults are the kernel as shipped.
    Every wait on a peer's flag gives up after the bound in the watch slot ``watch_ptr``
    (``kernels/common/watch.py``), recorded there, and the program goes on: the kernel always ends.
    """
    pid = tl.program_id(0)
    grid = num_producers + num_consumers  # the GEMM launch's grid (the interpreter's earlier steps: fewer)
    epoch, flags, inbox = begin_call(
        sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, grid, WORLD_SIZE, (STEPS & 4) != 0
    )
    dedicated = pid < num_producers
    ok = 1  # 0 once a wait of this program on a peer gave up (``watch_ptr``'s bound): later ones poll once
    if STEPS & 3:
        if dedicated | (num_producers == 0):
            movers = tl.where(num_producers > 0, num_producers, num_consumers)
            ok = produce_chunks(
                pid, movers, a_ptr, inbox, flags, heap_bases, rank, epoch, Ms, Ks, rcw, n_rc, kcw, n_kc,
                stride_am, watch_ptr, WORLD_SIZE, ALIGNED, P_ROWS, P_COLS, STEPS, PULL, PUSH_ORDER,
                RELEASE_EACH,
            )  # fmt: skip
    if STEPS & 4:
        # the queue: the low 32 bits of sync[1] (little-endian), drawn in wrapping int32 arithmetic
        queue = (sync_ptr + 1).to(tl.pointer_type(tl.int32))
        # the queue's value at this call's start, folded into the offset the drawn values are added to
        drawn_before = (epoch - 1) * (tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) + num_producers)
        offset = num_consumers
        if not WHOLE_K:  # dedicated producers join through the queue (else tiles are dealt statically)
            offset = num_consumers - drawn_before
        if dedicated:  # done moving: take tiles from the queue like a consumer between tiles
            first_tile = offset + tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
        else:
            first_tile = pid - num_producers
        if TMA:
            tl.static_assert(not PULL, "push_tma: push transport only")
            consume_tiles_tma(
                first_tile, offset, queue, a_ptr, inbox, b_ptr, c_ptr, flags, watch_ptr, ok, rank, epoch, M,
                N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
                GATHER_DIM, WORLD_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, B_ROW_MAJOR, WHOLE_K,
                DYNAMIC=not WHOLE_K, GROUP_ACROSS=GROUP_ACROSS,
            )  # fmt: skip
        else:
            consume_tiles(
                first_tile, offset, queue, a_ptr, inbox, b_ptr, c_ptr, flags, watch_ptr, ok, rank, epoch, M,
                N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
                GATHER_DIM, WORLD_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, EVEN_N, ALIGNED,
                PREFETCH_K, B_ROW_MAJOR, WHOLE_K, DYNAMIC=not WHOLE_K, GROUP_ACROSS=GROUP_ACROSS,
            )  # fmt: skip
