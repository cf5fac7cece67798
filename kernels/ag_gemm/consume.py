"""The fused ag_gemm kernels' plain consumer: the persistent GEMM over the local shard and the inbox, each
tile waiting for the chunks of the rows (or K-slices) it reads (``cp.async`` loads; the TMA consumer is
:mod:`.consume_tma`)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.gemm import mma_k_range, store_tile
from ..common.tiles import grouped_tile, rotate
from .protocol import wait_segment


@triton.jit
def k_segments(chunks, Ks, WHOLE_K: tl.constexpr):
    """``(loops, span)``: K loops per tile (segment) and the columns each covers (``WHOLE_K``: one loop
    over the whole shard, after waiting for every K chunk)."""
    loops = chunks.n_kc
    span = chunks.kcw
    if WHOLE_K:
        loops = 1
        span = Ks
    return loops, span


@triton.jit
def tile_group(Ms, LAYOUT: tl.constexpr, TILES: tl.constexpr):
    """The grouped order's group size: gather_dim=0 tiles of one group stay inside one shard (else a
    group waits on two ranks); ``WHOLE_K``: all data lands at once, and a wider group reads B fewer
    times. ``GROUP_ACROSS``: ``GROUP_M`` over the gathered M, groups spanning shards: where a shard is one
    tile row (8 ranks, M=1024), a group of one row reads B once per row tile."""
    group = TILES.GROUP_M
    if LAYOUT.GATHER_DIM == 0:
        if not TILES.WHOLE_K:
            if not TILES.GROUP_ACROSS:
                group = tl.minimum(group, tl.maximum(Ms // TILES.BLOCK_M, 1))
    return group


@triton.jit
def next_tile_of(tile_id, num_consumers, queue_ptr, DYNAMIC: tl.constexpr):
    """The tile this program takes after ``tile_id``: drawn from the queue (``DYNAMIC``; asked before the
    tile's work, so the atomic's round trip overlaps it) or dealt statically."""
    if DYNAMIC:
        next_tile = num_consumers + tl.atomic_add(queue_ptr, 1, sem="relaxed", scope="gpu")
    else:
        next_tile = tile_id + num_consumers
    return next_tile


@triton.jit
def tile_at(tile_id, num_pid_m, num_pid_n, group, first_local_m, GATHER_DIM: tl.constexpr):
    """``(pid_m, pid_n)`` of tile ``tile_id`` in grouped order; gather_dim=0 starts at the first row
    tile holding local rows, then the next ranks' rows."""
    pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, group)
    if GATHER_DIM == 0:
        pid_m = rotate(pid_m, first_local_m, num_pid_m)
    return pid_m, pid_n


@triton.jit
def prefetch_l2(ptrs):
    """Fetch the cache lines of ``ptrs`` into L2 without filling registers (PTX ``prefetch.global.L2``;
    NVIDIA only: the launcher enables it only there)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def prefetch_b_rows(b_ptr, pid_n, N, K, stride_bk, stride_bn, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                    B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    """Warm L2 with the first ``ROWS`` rows of B's column block ``pid_n``: one prefetch per 128-byte line.

    At small M the GEMM is bound by reading B; a tile that must wait for peers' rows of A first asks
    for the start of its B slab, so the wait overlaps B's traffic instead of delaying it.
    """
    LINE: tl.constexpr = 1024 // b_ptr.dtype.element_ty.primitive_bitwidth  # elements per 128 bytes
    if B_ROW_MAJOR:  # a line runs along N
        COLS: tl.constexpr = BLOCK_N // LINE if BLOCK_N >= LINE else 1
        cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, COLS) * LINE, N - 1).to(tl.int64)
        for r0 in tl.static_range(0, ROWS, 128):
            rows = tl.minimum(r0 + tl.arange(0, 128), K - 1).to(tl.int64)
            prefetch_l2(b_ptr + rows[:, None] * stride_bk + cols[None, :] * stride_bn)
    else:  # a line runs along K
        KLINES: tl.constexpr = ROWS // LINE if ROWS >= LINE else 1
        cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
        rows = tl.minimum(tl.arange(0, KLINES) * LINE, K - 1).to(tl.int64)
        prefetch_l2(b_ptr + rows[:, None] * stride_bk + cols[None, :] * stride_bn)


@triton.jit
def consume_tiles(first_tile, num_consumers, call, ok, io, sizes, chunks, strides, LAYOUT: tl.constexpr,
                  TILES: tl.constexpr):  # fmt: skip
    """The consumer (GEMM) side: persistent loop over output tiles, waiting per chunk for peers' A.

    ``call`` is this call's state: ``(queue_ptr, inbox_ptr, flags_ptr, watch_ptr, rank, epoch)``, the
    inbox and flags at the call's parity slot; the other groups are the kernel's (:mod:`.args`).
    Tile ``first_tile`` first, then every ``num_consumers``-th tile after it, or (not ``WHOLE_K``) tile
    ``num_consumers + q`` for each value ``q`` drawn from the relaxed atomic counter ``queue_ptr`` (the
    caller folds the counter's value at the call's start into ``num_consumers``), so programs that start
    late (producers done with their chunks) take whatever is left. gather_dim=0
    groups never straddle two ranks' rows (at most ``Ms // BLOCK_M`` row tiles a group) unless
    ``WHOLE_K``: the tiles of local rows come first and never wait, and the peers' rows follow once
    they have landed. (With ``WHOLE_K`` every program moves its share first, so the data lands at once
    and a wide group that reads B fewer times pays more: measured at M=512, 131 against 119 us.)

    ``WHOLE_K``: a tile waits for all K chunks of the peers' rows it needs, then runs one pipelined K
    loop (used when every program produces first: the chunks are all in flight within microseconds,
    and a loop per K chunk would drain and refill the software pipeline at every chunk boundary).

    Local rows / K-slice come straight from the user's tensor; peers' from this rank's inbox slot
    ``inbox_ptr`` (``(WORLD_SIZE, Ms, Ks)``, slot ``src`` holds ``src``'s shard), guarded by the
    flags ``flags_ptr`` (``(WORLD_SIZE, n_rc, n_kc)``). A is addressed as ``io.a + row_off + k``
    with ``row_off`` chosen by selects, never by a branch: a branch-yielded offset loses its alignment
    hint, A's loads then fall back to 2-byte accesses the software pipeline cannot issue as
    ``cp.async``, and the MMA runs synchronously (measured: gather_dim=1 at 8x the GEMM's time).

    Waits give up after the bound of the watch slot ``watch_ptr`` (``ok`` 0: one did, later ones poll once;
    ``kernels/common/watch.py``).
    """
    BLOCK_M: tl.constexpr = TILES.BLOCK_M  # shapes take constexprs (a group's field is a plain value)
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    ELEM: tl.constexpr = io.a.dtype.element_ty.primitive_bitwidth // 8
    VEC: tl.constexpr = 16 // ELEM
    queue_ptr, inbox_ptr, flags_ptr, watch_ptr, rank, epoch = call
    num_pid_m = tl.cdiv(sizes.M, TILES.BLOCK_M)
    num_pid_n = tl.cdiv(sizes.N, TILES.BLOCK_N)
    offs_k = tl.arange(0, TILES.BLOCK_K)
    # the inbox slot as an element offset from A: one address expression serves local and peers' rows
    inbox = (tl.cast(inbox_ptr, tl.int64) - tl.cast(io.a, tl.int64)) // ELEM
    # gather_dim=0: start at the first row tile holding local rows, then the next ranks' rows.
    first_local_m = (rank * sizes.Ms) // TILES.BLOCK_M
    loops, span = k_segments(chunks, sizes.Ks, TILES.WHOLE_K)
    group = tile_group(sizes.Ms, LAYOUT, TILES)
    tile_id = first_tile
    while tile_id < num_pid_m * num_pid_n:
        next_tile = next_tile_of(tile_id, num_consumers, queue_ptr, not TILES.WHOLE_K)
        pid_m, pid_n = tile_at(tile_id, num_pid_m, num_pid_n, group, first_local_m, LAYOUT.GATHER_DIM)
        offs_m = pid_m * TILES.BLOCK_M + tl.arange(0, TILES.BLOCK_M)
        offs_n = pid_n * TILES.BLOCK_N + tl.arange(0, TILES.BLOCK_N)
        mask_n = offs_n < sizes.N
        rows = tl.where(offs_m < sizes.M, offs_m, sizes.M - 1).to(tl.int64)
        first_row = pid_m * TILES.BLOCK_M
        last_row = tl.minimum(first_row + TILES.BLOCK_M, sizes.M) - 1
        b_cols = io.b + offs_n[None, :] * strides.bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if LAYOUT.GATHER_DIM == 0:
            owner = rows // sizes.Ms
            lrow = rows - owner * sizes.Ms
            row_off = tl.where(owner == rank, lrow * strides.am, inbox + rows * sizes.Ks)
            if LAYOUT.ALIGNED:  # every row starts on 16 bytes; in this function, since the hint marks
                row_off = tl.multiple_of(row_off, VEC)  # the op defining the value (none for an argument)
            src_lo = first_row // sizes.Ms
            src_hi = last_row // sizes.Ms
            if TILES.PREFETCH_K > 0:
                if src_lo != rank or src_hi != rank:  # this tile waits for peers' rows: meanwhile
                    prefetch_b_rows(
                        io.b, pid_n, sizes.N, sizes.K, strides.bk, strides.bn, TILES.PREFETCH_K,
                        TILES.BLOCK_N, LAYOUT.B_ROW_MAJOR,
                    )  # fmt: skip
            # One K loop per tile (a second call site would double the pipeline's shared memory):
            # K chunk by K chunk, waiting only for peers' rows (WHOLE_K: every chunk first, then one
            # loop over K); tiles of local rows never wait.
            for kc in range(0, loops):
                k_lo = kc * chunks.kcw
                k_hi = tl.minimum(k_lo + span, sizes.K)
                for src in range(src_lo, src_hi + 1):
                    if src != rank:
                        lo = tl.maximum(first_row - src * sizes.Ms, 0)
                        hi = tl.minimum(last_row - src * sizes.Ms, sizes.Ms - 1)
                        ok = wait_segment(
                            flags_ptr, epoch, src, lo, hi, kc, chunks, watch_ptr, ok, TILES.WHOLE_K
                        )
                a_ptrs = io.a + row_off[:, None] + (k_lo + offs_k)[None, :]
                b_ptrs = b_cols + (k_lo + offs_k)[:, None] * strides.bk
                acc = mma_k_range(
                    acc, a_ptrs, b_ptrs, k_lo, k_hi, 1, strides.bk, mask_n, TILES.BLOCK_K, LAYOUT.EVEN_K,
                    LAYOUT.EVEN_N,
                )  # fmt: skip
        else:
            # gather_dim=1: the local K-slice first, then the peers' slices in rank-rotated order.
            for step in range(0, LAYOUT.WORLD_SIZE):
                src = rotate(rank, step, LAYOUT.WORLD_SIZE)
                local = src == rank
                base = tl.where(local, 0, inbox + tl.cast(src, tl.int64) * sizes.Ms * sizes.Ks)
                row_stride = tl.cast(tl.where(local, strides.am, sizes.Ks), tl.int64)
                row_off = base + rows * row_stride
                if LAYOUT.ALIGNED:
                    row_off = tl.multiple_of(row_off, VEC)
                for kc in range(0, loops):
                    k_lo = kc * chunks.kcw
                    k_hi = tl.minimum(k_lo + span, sizes.Ks)
                    if not local:
                        ok = wait_segment(
                            flags_ptr, epoch, src, first_row, last_row, kc, chunks, watch_ptr, ok,
                            TILES.WHOLE_K,
                        )  # fmt: skip
                    a_ptrs = io.a + row_off[:, None] + (k_lo + offs_k)[None, :]
                    b_ptrs = b_cols + (src * sizes.Ks + k_lo + offs_k)[:, None] * strides.bk
                    acc = mma_k_range(
                        acc, a_ptrs, b_ptrs, k_lo, k_hi, 1, strides.bk, mask_n, TILES.BLOCK_K, LAYOUT.EVEN_K,
                        LAYOUT.EVEN_N,
                    )  # fmt: skip
        store_tile(io.c, acc, offs_m, offs_n, sizes.M, sizes.N, strides.cm, strides.cn)
        tile_id = next_tile
