"""The fused ag_gemm kernels' protocol on the device: epoch, inbox, flags and the producers that move chunks.

Both variants fill the same per-rank inbox (``2 parity x WORLD_SIZE x Ms x Ks`` in the symmetric heap;
slot ``src`` holds rank ``src``'s shard) and run the same consumer GEMM over it, so every remote byte
crosses NVLink/xGMI once. They differ only in who moves it (the ``PULL`` constexpr of
:func:`fused_ag_gemm_kernel`): push producers store the local shard into every peer's inbox; pull
producers stage the local shard in their own inbox slot, then load each peer's staged chunks into
their own inbox.

Synchronisation contract:

* **Epoch from arrivals, nothing after the tile loop.** ``sync`` is two int64 words that only ever
  grow: ``sync[0]`` counts program arrivals (each program of the GEMM's launch adds 1 when it starts),
  ``sync[1]`` the tiles handed out by the queue (its low 32 bits, wrapping). Every program of call ``e``
  starts after all of call ``e - 1``'s programs (one stream, one launch per call), so its arrival
  number is ``(e - 1) * grid + i`` and ``epoch = arrival // grid + 1``; the queue advances by exactly
  ``tiles + dedicated producers`` per call (each tile handed out once, each program's last request
  past the end), so call ``e`` takes tile ``num_consumers + (q - (e - 1) * (tiles + producers))`` for
  the value ``q`` it draws, in 32-bit wrapping arithmetic. No program writes anything after its last
  tile: a store or atomic there made the compiler keep ~25 more registers live across the K loop
  (128x128 tiles on 4 warps: 244 instead of 221) and cost 7-11% of the GEMM's speed. Nothing on the
  host changes between calls, so a captured CUDA graph replays correctly. (The interpreter's split
  launches read ``sync[0]`` without counting in the producers' steps.)
* **Flags by epoch, double-buffered by parity.** The shard is cut into chunks (rows x K columns,
  K-chunk major so the first K columns arrive first); flag ``[src, chunk]`` says chunk ``chunk`` of
  ``src``'s shard is in slot ``src`` of the inbox holding it. A writer copies a chunk, runs a CTA
  barrier, then one thread releases at system scope; readers spin with acquire loads at system scope
  until the flag reaches their epoch. Data and flags of call ``e`` live in slot ``e % 2``: a rank is
  at most one call ahead of a peer (each call waits for the peer's data of that call), so slot
  ``e % 2`` was last read two calls ago, which has finished on every rank. Flags are never reset.
* **No starvation.** Consumers wait only on producers; producers wait at most on the peers' producers
  in a phase that itself never waits (pull's staging), so every wait ends whatever the grid size.
  Dedicated producers join the GEMM once their chunks are moved, taking tiles from the same queue as
  the consumers (``sync[1]``, one relaxed atomic per tile); they wait on nothing before that. With
  no dedicated producers the tiles are dealt statically (program ``p``: tiles ``p, p + grid, ...``). With
  ``comm_sms=0`` each program does its producer share before it waits on anything; the grid is at
  most one program per SM, so all of it is resident together and no waiting program can hold the SM
  another program's share needs.

Consumers read A through per-row element offsets relative to the local shard's pointer (local rows
from the user's tensor, peers' rows from the local inbox), chosen by selects so the K loop stays one
software-pipelined loop (``cp.async`` for A and B, asynchronous ``wgmma``); ``autotaxer/tools/sm90.py``
checks that on the sm_90 compile. Only tile sizes, schedule and world size are compile-time; shapes
and strides are runtime.
"""

from __future__ import annotations

import iris
import triton
import triton.language as tl

from ..common.sync import epoch_begin, heap_delta
from ..common.watch import spin_one, spin_until


@triton.jit
def begin_call(
    sync_ptr, flags_ptr, inbox_ptr, sizes, chunks, grid, WORLD_SIZE: tl.constexpr, COUNT: tl.constexpr
):
    """``(epoch, flags, inbox)``: this call's epoch and its parity slot of the flags and of the inbox."""
    epoch = epoch_begin(sync_ptr, grid, COUNT)
    parity = epoch % 2
    flags = flags_ptr + parity * (WORLD_SIZE * chunks.n_rc * chunks.n_kc)
    inbox = inbox_ptr + parity.to(tl.int64) * (WORLD_SIZE * sizes.Ms) * sizes.Ks
    return epoch, flags, inbox


#: Row-chunk flags one wait polls at once (a tile spans at most ``row_chunks`` (<= 16) of them).
WAIT_WIDTH = tl.constexpr(16)


@triton.jit
def wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, chunks, watch_ptr, ok):
    """Wait for the row chunks of ``src`` covering shard rows ``first_row..last_row`` in K chunk ``kc``, at
    most the watch slot's bound; returns ``ok`` (0 once a wait of this program gave up)."""
    rc_hi = last_row // chunks.rcw
    for rc0 in range(first_row // chunks.rcw, rc_hi + 1, WAIT_WIDTH):
        rcs = rc0 + tl.arange(0, WAIT_WIDTH)
        idx = (src * chunks.n_rc + rcs) * chunks.n_kc + kc
        ok = spin_until(flags_ptr + idx, rcs <= rc_hi, epoch, watch_ptr, src, idx, ok)
    return ok


#: Flags :func:`wait_all_k` polls at once.
WAIT_ALL_WIDTH = tl.constexpr(64)


@triton.jit
def wait_all_k(flags_ptr, epoch, src, first_row, last_row, chunks, watch_ptr, ok):
    """Wait for every K chunk of the row chunks of ``src`` covering shard rows ``first_row..last_row``:
    their flags (``[src, rc, kc]``, K chunk fastest) are one contiguous run. Bounded as :func:`wait_rows`."""
    lo = (src * chunks.n_rc + first_row // chunks.rcw) * chunks.n_kc
    hi = (src * chunks.n_rc + last_row // chunks.rcw) * chunks.n_kc + chunks.n_kc - 1
    for f0 in range(lo, hi + 1, WAIT_ALL_WIDTH):
        fs = f0 + tl.arange(0, WAIT_ALL_WIDTH)
        ok = spin_until(flags_ptr + fs, fs <= hi, epoch, watch_ptr, src, fs, ok)
    return ok


@triton.jit
def wait_segment(
    flags_ptr, epoch, src, first_row, last_row, kc, chunks, watch_ptr, ok, WHOLE_K: tl.constexpr
):
    """A consumer's wait before K segment ``kc`` of ``src``'s shard rows ``first_row..last_row``: that K
    chunk's flags, or (``WHOLE_K``: one segment) every K chunk's; returns ``ok`` (:func:`wait_rows`)."""
    if WHOLE_K:
        ok = wait_all_k(flags_ptr, epoch, src, first_row, last_row, chunks, watch_ptr, ok)
    else:
        ok = wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, chunks, watch_ptr, ok)
    return ok


@triton.jit
def copy_chunk(
    src_ptr, src_off, src_stride, dst_ptr, dst_off, box, Ks, ALIGNED: tl.constexpr, MOVES: tl.constexpr
):
    """Copy rows ``r0..r1``, columns ``k0..k1`` (``box``, half-open) of a shard into an inbox slot (row
    stride ``Ks``), ``MOVES.P_ROWS x MOVES.P_COLS`` elements at a time.

    Element ``(r, k)`` is read at ``src_ptr + src_off + r * src_stride + k`` and written at
    ``dst_ptr + dst_off + r * Ks + k``; the scalar offsets carry a peer's heap translation, so one
    helper serves local staging, remote stores (push) and remote loads (pull), all 16-byte vectors
    when ``ALIGNED``.
    """
    r0, r1, k0, k1 = box
    P_ROWS: tl.constexpr = MOVES.P_ROWS
    P_COLS: tl.constexpr = MOVES.P_COLS
    VEC: tl.constexpr = 128 // src_ptr.dtype.element_ty.primitive_bitwidth
    for r in range(r0, r1, P_ROWS):
        rows = r + tl.arange(0, P_ROWS)
        s_rows = src_off + rows.to(tl.int64) * src_stride
        d_rows = dst_off + rows.to(tl.int64) * Ks
        if ALIGNED:
            s_rows = tl.multiple_of(s_rows, VEC)
            d_rows = tl.multiple_of(d_rows, VEC)
        for k in range(k0, k1, P_COLS):
            # k is a multiple of BLOCK_K (>= 16): chunks start on BLOCK_K, steps are P_COLS >= 16
            cols = tl.max_contiguous(tl.multiple_of(k + tl.arange(0, P_COLS), 16), P_COLS)
            mask = (rows < r1)[:, None] & (cols < k1)[None, :]
            val = tl.load(src_ptr + s_rows[:, None] + cols[None, :], mask=mask)
            tl.store(dst_ptr + d_rows[:, None] + cols[None, :], val, mask=mask)


@triton.jit
def chunk_bounds(chunk, sizes, chunks):
    """``(rc, kc, box)`` of chunk number ``chunk`` (K-chunk major): its row and K chunk and its rows
    ``r0..r1`` and columns ``k0..k1`` (half-open), ``box = (r0, r1, k0, k1)``."""
    kc = chunk // chunks.n_rc
    rc = chunk % chunks.n_rc
    r0 = rc * chunks.rcw
    k0 = kc * chunks.kcw
    return rc, kc, (r0, tl.minimum(r0 + chunks.rcw, sizes.Ms), k0, tl.minimum(k0 + chunks.kcw, sizes.Ks))


@triton.jit
def push_peer(rank, i, WORLD_SIZE: tl.constexpr, PUSH_ORDER: tl.constexpr):
    """The ``i``-th peer (1 <= i < WORLD_SIZE) push sends a chunk to. ``PUSH_ORDER`` 0: ``rank + i``; 1:
    ``rank - i``, the peers in the order they consume this shard (each consumer starts at its own rows,
    then the next ranks', so rank ``rank - 1`` reads this shard first, ``rank + 1`` last)."""
    if PUSH_ORDER == 0:
        peer = (rank + i) % WORLD_SIZE
    else:
        peer = (rank - i + WORLD_SIZE) % WORLD_SIZE
    return peer


@triton.jit
def produce_chunks(
    pid,
    movers,
    a_ptr,
    inbox_ptr,
    flags_ptr,
    heap_bases,
    watch_ptr,
    rank,
    epoch,
    sizes,
    chunks,
    stride_am,
    LAYOUT: tl.constexpr,
    MOVES: tl.constexpr,
):
    """Move chunks ``pid, pid + movers, ...`` of the local shard (K-chunk major), each followed by a CTA
    barrier and one release (system scope) of its flag at ``epoch``.

    Push (step 1): store each chunk into slot ``rank`` of every peer's inbox and raise its flag there.
    Pull: step 1 stages each chunk in the local inbox's slot ``rank`` and raises the local flag (never
    waits); step 2 waits (acquire, system scope) for each peer's staging flag of the chunk, loads the
    chunk from the peer's slot into the local inbox and raises the local flag the consumers wait on.
    Remote addresses are the heap translation of ``iris.store``/``iris.load``, hoisted out of the copy.
    Push's peers in the order of :func:`push_peer` (``PUSH_ORDER``); ``RELEASE_EACH``: each peer's flag is
    released right after its copy (a barrier each), so a chunk is usable by a peer as soon as it lands
    there instead of after the copies to every peer. Returns ``ok`` (pull's waits are bounded by the
    watch slot, :func:`~..common.watch.spin_one`): 0 once one gave up.
    """
    WORLD_SIZE: tl.constexpr = LAYOUT.WORLD_SIZE
    ALIGNED: tl.constexpr = LAYOUT.ALIGNED
    ok = 1
    slot_elems = tl.cast(sizes.Ms, tl.int64) * sizes.Ks
    own = tl.cast(rank, tl.int64) * slot_elems  # this rank's slot in every inbox
    n_rc = chunks.n_rc
    n_kc = chunks.n_kc
    Ks = sizes.Ks
    if MOVES.STEPS & 1:
        for chunk in range(pid, n_rc * n_kc, movers):
            rc, kc, box = chunk_bounds(chunk, sizes, chunks)
            flag = flags_ptr + (rank * n_rc + rc) * n_kc + kc
            if MOVES.PULL:
                copy_chunk(a_ptr, 0, stride_am, inbox_ptr, own, box, Ks, ALIGNED, MOVES)
                tl.debug_barrier()  # all of this CTA's stores precede the single release below
                tl.atomic_xchg(flag, epoch, sem="release", scope="sys")
            elif MOVES.RELEASE_EACH:
                for i in tl.static_range(1, WORLD_SIZE):
                    peer = push_peer(rank, i, WORLD_SIZE, MOVES.PUSH_ORDER)
                    dst = own + heap_delta(inbox_ptr, rank, peer, heap_bases)
                    copy_chunk(a_ptr, 0, stride_am, inbox_ptr, dst, box, Ks, ALIGNED, MOVES)
                    tl.debug_barrier()  # all of this CTA's stores to the peer precede its release
                    iris.atomic_xchg(flag, epoch, rank, peer, heap_bases, sem="release", scope="sys")
            else:
                for i in tl.static_range(1, WORLD_SIZE):
                    peer = push_peer(rank, i, WORLD_SIZE, MOVES.PUSH_ORDER)
                    dst = own + heap_delta(inbox_ptr, rank, peer, heap_bases)
                    copy_chunk(a_ptr, 0, stride_am, inbox_ptr, dst, box, Ks, ALIGNED, MOVES)
                tl.debug_barrier()  # all of this CTA's stores precede the single release below
                for i in tl.static_range(1, WORLD_SIZE):
                    peer = push_peer(rank, i, WORLD_SIZE, MOVES.PUSH_ORDER)
                    iris.atomic_xchg(flag, epoch, rank, peer, heap_bases, sem="release", scope="sys")
    if MOVES.PULL:
        if MOVES.STEPS & 2:
            for chunk in range(pid, n_rc * n_kc, movers):
                rc, kc, box = chunk_bounds(chunk, sizes, chunks)
                for i in tl.static_range(1, WORLD_SIZE):
                    src = (rank + i) % WORLD_SIZE
                    idx = (src * n_rc + rc) * n_kc + kc
                    flag = flags_ptr + idx
                    # the peer's own flag for this chunk sits at the same index of its heap
                    theirs = flag + heap_delta(flags_ptr, rank, src, heap_bases)
                    ok = spin_one(theirs, epoch, watch_ptr, src, idx, ok)
                    slot = tl.cast(src, tl.int64) * slot_elems
                    remote = slot + heap_delta(inbox_ptr, rank, src, heap_bases)
                    copy_chunk(inbox_ptr, remote, Ks, inbox_ptr, slot, box, Ks, ALIGNED, MOVES)
                    tl.debug_barrier()  # all of this CTA's stores precede the single release below
                    tl.atomic_xchg(flag, epoch, sem="release", scope="sys")
    return ok
