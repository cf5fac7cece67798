"""``ag_gemm`` push: producer CTAs store the local shard into every peer's inbox, consumers GEMM locally.

Program ids ``0 .. comm_sms-1`` are producers: per chunk (rows x K columns, K-chunk major so the
first K columns arrive first) they copy the local shard into slot ``rank`` of each peer's inbox for
this call (16-byte remote stores: the peer's address is the heap translation ``iris.store`` does,
hoisted out of the copy loop), then a CTA barrier and one ``iris.atomic_xchg`` (release, system scope)
per peer raise the chunk's flag to this call's epoch. The other programs run the persistent GEMM of
``_ag_fused.consume_tiles``: local rows / K-slice first, then peers' data, read from the local inbox
after an acquire wait on its chunk flag. Producers never wait, so no grid size can starve them.
With ``comm_sms=0`` there are no dedicated producers: every program pushes its share of the chunks,
then runs its tiles (see ``FusedConfig``). Synchronisation details (device epoch, parity slots) are in
``_ag_fused``.
"""

from __future__ import annotations

import iris
import triton
import triton.language as tl

from ._ag_fused import (
    FusedConfig,
    begin_call,
    chunk_bounds,
    consume_tiles,
    copy_chunk,
    epoch_end,
    fused_launcher,
    heap_delta,
)


@triton.jit
def _push_chunks(
    pid,
    num_producers,
    a_ptr,
    inbox_ptr,
    flags_ptr,
    heap_bases,
    rank,
    epoch,
    Ms,
    Ks,
    rcw,
    n_rc,
    kcw,
    n_kc,
    stride_am,
    WORLD_SIZE: tl.constexpr,
    ALIGNED: tl.constexpr,
    P_ROWS: tl.constexpr,
    P_COLS: tl.constexpr,
):
    own = tl.cast(rank, tl.int64) * Ms * Ks  # this rank's slot in every inbox
    for chunk in range(pid, n_rc * n_kc, num_producers):
        rc, kc, r0, r1, k0, k1 = chunk_bounds(chunk, Ms, Ks, rcw, n_rc, kcw)
        for i in tl.static_range(1, WORLD_SIZE):
            peer = (rank + i) % WORLD_SIZE
            dst = own + heap_delta(inbox_ptr, rank, peer, heap_bases)
            copy_chunk(a_ptr, 0, stride_am, inbox_ptr, dst, r0, r1, k0, k1, Ks, ALIGNED, P_ROWS, P_COLS)
        tl.debug_barrier()  # all of this CTA's stores precede the single release below
        for i in tl.static_range(1, WORLD_SIZE):
            iris.atomic_xchg(
                flags_ptr + (rank * n_rc + rc) * n_kc + kc,
                epoch,
                rank,
                (rank + i) % WORLD_SIZE,
                heap_bases,
                sem="release",
                scope="sys",
            )


@triton.jit
def _ag_gemm_push_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    inbox_ptr,
    flags_ptr,
    sync_ptr,
    heap_bases,
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
    pid_offset,
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
):
    pid = tl.program_id(0) + pid_offset
    epoch, flags, inbox = begin_call(sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, WORLD_SIZE)
    dedicated = pid < num_producers
    # programs sharing the producer steps: the dedicated producers, else (comm_sms=0) every program
    movers = tl.where(num_producers > 0, num_producers, num_consumers)
    if STEPS & 1:
        if dedicated | (num_producers == 0):
            _push_chunks(
                pid,
                movers,
                a_ptr,
                inbox,
                flags,
                heap_bases,
                rank,
                epoch,
                Ms,
                Ks,
                rcw,
                n_rc,
                kcw,
                n_kc,
                stride_am,
                WORLD_SIZE,
                ALIGNED,
                P_ROWS,
                P_COLS,
            )
    if dedicated:
        if STEPS != 2:  # the interpreter's extra "fetch" launch repeats programs already counted
            epoch_end(sync_ptr, epoch, num_producers + num_consumers)
    else:
        if STEPS & 4:
            consume_tiles(
                pid - num_producers,
                num_consumers,
                a_ptr,
                inbox,
                b_ptr,
                c_ptr,
                flags,
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
                GATHER_DIM,
                WORLD_SIZE,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                GROUP_M,
                EVEN_K,
                EVEN_N,
                ALIGNED,
                PREFETCH_K,
                B_ROW_MAJOR,
                WHOLE_K,
            )
            epoch_end(sync_ptr, epoch, num_producers + num_consumers)


KERNEL = _ag_gemm_push_kernel


class PushConfig(FusedConfig):
    """Config of the push kernel (see :class:`FusedConfig`)."""


#: ``ag_gemm_push(*, a_shard, b, out, inbox, flags, sync, heap_bases, rank, world_size, gather_dim,
#: config, num_sms, phase="all") -> out``: see :func:`_ag_fused.fused_launcher`.
ag_gemm_push = fused_launcher(_ag_gemm_push_kernel, "push")
