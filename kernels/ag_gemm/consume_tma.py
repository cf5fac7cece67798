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
def consume_tiles_tma(
    first_tile,
    num_consumers,
    queue_ptr,
    a_ptr,
    inbox_ptr,
    b_ptr,
    c_ptr,
    flags_ptr,
    watch_ptr,
    ok,
    rank,
    epoch,
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
    GATHER_DIM: tl.constexpr,
    WORLD_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    B_ROW_MAJOR: tl.constexpr,
    WHOLE_K: tl.constexpr,
    DYNAMIC: tl.constexpr,
    GROUP_ACROSS: tl.constexpr = False,
):
    """``push``'s consumer (``consume.consume_tiles``: the same tile order, queue and waits)
    with TMA loads. gather_dim=0 requires ``Ms % BLOCK_M == 0`` (a tile's rows have one owner)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    first_local_m = (rank * Ms) // BLOCK_M
    loops, span = k_segments(n_kc, kcw, Ks, WHOLE_K)
    group = tile_group(Ms, GATHER_DIM, BLOCK_M, GROUP_M, WHOLE_K, GROUP_ACROSS)
    if GATHER_DIM == 0:
        b_desc = b_descriptor(b_ptr, K, N, stride_bk, stride_bn, BLOCK_K, BLOCK_N, B_ROW_MAJOR)
    slot_elems = tl.cast(Ms, tl.int64) * Ks
    tile_id = first_tile
    while tile_id < num_pid_m * num_pid_n:
        next_tile = next_tile_of(tile_id, num_consumers, queue_ptr, DYNAMIC)
        pid_m, pid_n = tile_at(tile_id, num_pid_m, num_pid_n, group, first_local_m, GATHER_DIM)
        first_row = pid_m * BLOCK_M
        last_row = tl.minimum(first_row + BLOCK_M, M) - 1
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GATHER_DIM == 0:
            src = first_row // Ms
            local = src == rank
            base = tl.where(local, a_ptr, inbox_ptr + src.to(tl.int64) * slot_elems)
            stride = tl.where(local, stride_am, Ks).to(tl.int64)
            a_desc = tl.make_tensor_descriptor(base, [Ms, K], [stride, 1], [BLOCK_M, BLOCK_K])
            a_row = first_row - src * Ms
            for kc in range(0, loops):
                k_lo = kc * kcw
                k_hi = tl.minimum(k_lo + span, K)
                if not local:
                    last = a_row + BLOCK_M - 1
                    ok = wait_segment(
                        flags_ptr, epoch, src, a_row, last, kc, rcw, n_rc, n_kc, watch_ptr, ok, WHOLE_K
                    )
                acc = tma_k_range(acc, a_desc, a_row, b_desc, 0, off_n, k_lo, k_hi, BLOCK_K, B_ROW_MAJOR)
        else:
            for step in range(0, WORLD_SIZE):
                src = rotate(rank, step, WORLD_SIZE)
                local = src == rank
                base = tl.where(local, a_ptr, inbox_ptr + tl.cast(src, tl.int64) * slot_elems)
                stride = tl.where(local, stride_am, Ks).to(tl.int64)
                a_desc = tl.make_tensor_descriptor(base, [M, Ks], [stride, 1], [BLOCK_M, BLOCK_K])
                # B's rows of this K-slice only, so a ragged slice reads zeros past its end
                if B_ROW_MAJOR:
                    b_base = b_ptr + tl.cast(src, tl.int64) * Ks * stride_bk
                else:
                    b_base = b_ptr + tl.cast(src, tl.int64) * Ks
                b_desc = b_descriptor(b_base, Ks, N, stride_bk, stride_bn, BLOCK_K, BLOCK_N, B_ROW_MAJOR)
                for kc in range(0, loops):
                    k_lo = kc * kcw
                    k_hi = tl.minimum(k_lo + span, Ks)
                    if not local:
                        ok = wait_segment(
                            flags_ptr, epoch, src, first_row, last_row, kc, rcw, n_rc, n_kc, watch_ptr, ok,
                            WHOLE_K,
                        )  # fmt: skip
                    acc = tma_k_range(
                        acc, a_desc, first_row, b_desc, 0, off_n, k_lo, k_hi, BLOCK_K, B_ROW_MAJOR
                    )
        offs_m = first_row + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
        tile_id = next_tile
