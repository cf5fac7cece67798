"""``push_tma``'s consumer: the fused kernel's GEMM with TMA loads (NVIDIA Hopper and later).

Producers, flags, epoch, tile queue and inbox are ``push``'s (:mod:`.protocol`, whose
synchronisation contract holds unchanged: the same buffers, the same grid, the same arrival count).
Only the consumer's K loop differs: A and B tiles arrive by tensor-memory-access loads (one
``cp.async.bulk.tensor`` per tile and stage instead of per-thread ``cp.async`` copies), so no thread
holds A's or B's addresses, the software pipeline is deeper for the same registers, and ragged edges
(K, N, the last rows) are zero-filled by the copy engine of the SM instead of masked.

A tile's A rows come from one place: the user's shard (local rows or K-slice) or one slot of the
inbox (a peer's). Its descriptor is made on the device per tile (gather_dim=0) or per tile and source
rank (gather_dim=1) from a base pointer chosen by a select, so one pipelined K loop serves both.
That needs gather_dim=0 tiles that never straddle two ranks' rows (``Ms % BLOCK_M == 0``); the
launcher (:mod:`.push_tma`) checks that and the 16-byte alignment TMA needs, and runs
``push``'s kernel otherwise.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.gemm import store_tile
from ..common.tiles import rotate
from ..common.tma import b_descriptor, tma_k_range
from .consume import k_segments, next_tile_of, tile_at, tile_group
from .protocol import wait_segment


@triton.jit
def consume_tiles_tma(first_tile, num_consumers, call, ok, io, sizes, chunks, strides,
                      LAYOUT: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
    """``push``'s consumer (:func:`.consume.consume_tiles`: the same arguments, tile order, queue and
    waits) with TMA loads. gather_dim=0 requires ``Ms % BLOCK_M == 0`` (a tile's rows have one owner)."""
    BLOCK_M: tl.constexpr = TILES.BLOCK_M  # shapes take constexprs (a group's field is a plain value)
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    BLOCK_K: tl.constexpr = TILES.BLOCK_K
    queue_ptr, inbox_ptr, flags_ptr, watch_ptr, rank, epoch = call
    num_pid_m = tl.cdiv(sizes.M, TILES.BLOCK_M)
    num_pid_n = tl.cdiv(sizes.N, TILES.BLOCK_N)
    first_local_m = (rank * sizes.Ms) // TILES.BLOCK_M
    loops, span = k_segments(chunks, sizes.Ks, TILES.WHOLE_K)
    group = tile_group(sizes.Ms, LAYOUT, TILES)
    if LAYOUT.GATHER_DIM == 0:
        b_desc = b_descriptor(
            io.b, sizes.K, sizes.N, strides.bk, strides.bn, TILES.BLOCK_K, TILES.BLOCK_N, LAYOUT.B_ROW_MAJOR
        )
    slot_elems = tl.cast(sizes.Ms, tl.int64) * sizes.Ks
    tile_id = first_tile
    while tile_id < num_pid_m * num_pid_n:
        next_tile = next_tile_of(tile_id, num_consumers, queue_ptr, not TILES.WHOLE_K)
        pid_m, pid_n = tile_at(tile_id, num_pid_m, num_pid_n, group, first_local_m, LAYOUT.GATHER_DIM)
        first_row = pid_m * TILES.BLOCK_M
        last_row = tl.minimum(first_row + TILES.BLOCK_M, sizes.M) - 1
        off_n = pid_n * TILES.BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if LAYOUT.GATHER_DIM == 0:
            src = first_row // sizes.Ms
            local = src == rank
            base = tl.where(local, io.a, inbox_ptr + src.to(tl.int64) * slot_elems)
            stride = tl.where(local, strides.am, sizes.Ks).to(tl.int64)
            a_desc = tl.make_tensor_descriptor(base, [sizes.Ms, sizes.K], [stride, 1], [BLOCK_M, BLOCK_K])
            a_row = first_row - src * sizes.Ms
            for kc in range(0, loops):
                k_lo = kc * chunks.kcw
                k_hi = tl.minimum(k_lo + span, sizes.K)
                if not local:
                    last = a_row + TILES.BLOCK_M - 1
                    ok = wait_segment(
                        flags_ptr, epoch, src, a_row, last, kc, chunks, watch_ptr, ok, TILES.WHOLE_K
                    )
                acc = tma_k_range(
                    acc, a_desc, a_row, b_desc, 0, off_n, k_lo, k_hi, TILES.BLOCK_K, LAYOUT.B_ROW_MAJOR
                )
        else:
            for step in range(0, LAYOUT.WORLD_SIZE):
                src = rotate(rank, step, LAYOUT.WORLD_SIZE)
                local = src == rank
                base = tl.where(local, io.a, inbox_ptr + tl.cast(src, tl.int64) * slot_elems)
                stride = tl.where(local, strides.am, sizes.Ks).to(tl.int64)
                a_desc = tl.make_tensor_descriptor(base, [sizes.M, sizes.Ks], [stride, 1], [BLOCK_M, BLOCK_K])
                # B's rows of this K-slice only, so a ragged slice reads zeros past its end
                if LAYOUT.B_ROW_MAJOR:
                    b_base = io.b + tl.cast(src, tl.int64) * sizes.Ks * strides.bk
                else:
                    b_base = io.b + tl.cast(src, tl.int64) * sizes.Ks
                b_desc = b_descriptor(
                    b_base, sizes.Ks, sizes.N, strides.bk, strides.bn, TILES.BLOCK_K, TILES.BLOCK_N,
                    LAYOUT.B_ROW_MAJOR,
                )  # fmt: skip
                for kc in range(0, loops):
                    k_lo = kc * chunks.kcw
                    k_hi = tl.minimum(k_lo + span, sizes.Ks)
                    if not local:
                        ok = wait_segment(
                            flags_ptr, epoch, src, first_row, last_row, kc, chunks, watch_ptr, ok,
                            TILES.WHOLE_K,
                        )  # fmt: skip
                    acc = tma_k_range(
                        acc,
                        a_desc,
                        first_row,
                        b_desc,
                        0,
                        off_n,
                        k_lo,
                        k_hi,
                        TILES.BLOCK_K,
                        LAYOUT.B_ROW_MAJOR,
                    )
        offs_m = first_row + tl.arange(0, TILES.BLOCK_M)
        offs_n = off_n + tl.arange(0, TILES.BLOCK_N)
        store_tile(io.c, acc, offs_m, offs_n, sizes.M, sizes.N, strides.cm, strides.cn)
        tile_id = next_tile
