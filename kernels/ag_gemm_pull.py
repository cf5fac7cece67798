"""``ag_gemm`` pull: producers stage the local shard, then load each peer's staged chunks into the inbox.

A peer can only read what lives in the symmetric heap, so each call the ``comm_sms`` producer CTAs
first copy the local shard into slot ``rank`` of this rank's inbox, chunk by chunk (rows x K columns,
K-chunk major), each chunk followed by a CTA barrier and a release (system scope) of its own flag;
that step never waits. Then, per chunk and peer, they spin with acquire loads on the peer's flag for
that chunk (over NVLink/xGMI), copy the chunk from the peer's staging slot into slot ``peer`` of the
local inbox (16-byte remote loads: the heap translation of ``iris.load`` is hoisted out of the copy
loop), and release the local flag the consumers wait on. So every remote byte crosses the link once
(the first design re-read peers' A once per N tile: ~64x the traffic at N=8192), and the consumers
(``_ag_fused.consume_tiles``, shared with push) only read local memory. Producers wait only on the
peers' staging step, which never waits, so no grid size can starve anyone. With ``comm_sms=0`` every
program stages and fetches its share of the chunks, then runs its tiles (see ``FusedConfig``).
Synchronisation details (device epoch, parity slots) are in ``_ag_fused``.
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
def _pull_chunks(
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
    STEPS: tl.constexpr,
):
    slot_elems = tl.cast(Ms, tl.int64) * Ks
    if STEPS & 1:
        # Step 1, never waits: stage the own shard where peers can read it.
        own = tl.cast(rank, tl.int64) * slot_elems
        for chunk in range(pid, n_rc * n_kc, num_producers):
            rc, kc, r0, r1, k0, k1 = chunk_bounds(chunk, Ms, Ks, rcw, n_rc, kcw)
            copy_chunk(a_ptr, 0, stride_am, inbox_ptr, own, r0, r1, k0, k1, Ks, ALIGNED, P_ROWS, P_COLS)
            tl.debug_barrier()  # all of this CTA's stores precede the single release below
            tl.atomic_xchg(flags_ptr + (rank * n_rc + rc) * n_kc + kc, epoch, sem="release", scope="sys")
    if STEPS & 2:
        # Step 2: fetch each peer's staged chunks once, into the local inbox.
        for chunk in range(pid, n_rc * n_kc, num_producers):
            rc, kc, r0, r1, k0, k1 = chunk_bounds(chunk, Ms, Ks, rcw, n_rc, kcw)
            for i in tl.static_range(1, WORLD_SIZE):
                src = (rank + i) % WORLD_SIZE
                flag = flags_ptr + (src * n_rc + rc) * n_kc + kc
                # the peer's own flag for this chunk sits at the same index of its heap
                while iris.atomic_add(flag, 0, rank, src, heap_bases, sem="acquire", scope="sys") < epoch:
                    pass
                slot = tl.cast(src, tl.int64) * slot_elems
                remote = slot + heap_delta(inbox_ptr, rank, src, heap_bases)
                copy_chunk(
                    inbox_ptr, remote, Ks, inbox_ptr, slot, r0, r1, k0, k1, Ks, ALIGNED, P_ROWS, P_COLS
                )
                tl.debug_barrier()  # all of this CTA's stores precede the single release below
                tl.atomic_xchg(flag, epoch, sem="release", scope="sys")


@triton.jit
def _ag_gemm_pull_kernel(
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
    if STEPS & 3:
        if dedicated | (num_producers == 0):
            _pull_chunks(
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
                STEPS,
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


KERNEL = _ag_gemm_pull_kernel


class PullConfig(FusedConfig):
    """Config of the pull kernel (see :class:`FusedConfig`)."""


#: ``ag_gemm_pull(*, a_shard, b, out, inbox, flags, sync, heap_bases, rank, world_size, gather_dim,
#: config, num_sms, phase="all") -> out``: see :func:`_ag_fused.fused_launcher`.
ag_gemm_pull = fused_launcher(_ag_gemm_pull_kernel, "pull")
