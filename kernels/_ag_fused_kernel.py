"""Device side of the fused ag_gemm kernels (``push`` and ``pull``): one kernel, its building blocks.

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
software-pipelined loop (``cp.async`` for A and B, asynchronous ``wgmma``); ``bench/compile_hopper.py``
checks that on the sm_90 compile. Only tile sizes, schedule and world size are compile-time; shapes
and strides are runtime.
"""

from __future__ import annotations

import iris
import triton
import triton.language as tl

from ._tiles import grouped_tile, rotate
from .gemm import mma_k_range, store_tile


@triton.jit
def epoch_begin(sync_ptr, grid, COUNT: tl.constexpr):
    """This call's epoch (int32, from 1) from the arrival count ``sync[0]``; ``COUNT``: add this
    program's arrival (the launch that runs the GEMM; the interpreter's producer-only launches read)."""
    if COUNT:
        arrival = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    else:
        arrival = tl.load(sync_ptr, volatile=True)
    return (arrival // grid + 1).to(tl.int32)


@triton.jit
def begin_call(
    sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, grid, WORLD_SIZE: tl.constexpr, COUNT: tl.constexpr
):
    """``(epoch, flags, inbox)``: this call's epoch and its parity slot of the flags and of the inbox."""
    epoch = epoch_begin(sync_ptr, grid, COUNT)
    parity = epoch % 2
    flags = flags_ptr + parity * (WORLD_SIZE * n_rc * n_kc)
    inbox = inbox_ptr + parity.to(tl.int64) * (WORLD_SIZE * Ms) * Ks
    return epoch, flags, inbox


@triton.jit
def heap_delta(ptr, rank, peer, heap_bases):
    """Elements from ``ptr`` to the same heap offset on ``peer`` (the translation ``iris.load`` does).

    Hoisted out of the copy loops as one scalar so the per-element address arithmetic stays
    ``base + row * stride + col`` and its alignment (and so 16-byte vector accesses) stays provable.
    """
    elem: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    return (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // elem


@triton.jit
def spin_until(ptrs, live, epoch):
    """Spin until every live flag of ``ptrs`` reaches ``epoch``: acquire loads at system scope, side by
    side in the CTA's threads, so several flags cost one round trip."""
    pending = 1
    while pending > 0:
        seen = tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys")
        pending = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)


#: Row-chunk flags one wait polls at once (a tile spans at most ``row_chunks`` (<= 16) of them).
WAIT_WIDTH = tl.constexpr(16)


@triton.jit
def wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, rcw, n_rc, n_kc):
    """Wait for the row chunks of ``src`` covering shard rows ``first_row..last_row`` in K chunk ``kc``."""
    rc_hi = last_row // rcw
    for rc0 in range(first_row // rcw, rc_hi + 1, WAIT_WIDTH):
        rcs = rc0 + tl.arange(0, WAIT_WIDTH)
        spin_until(flags_ptr + (src * n_rc + rcs) * n_kc + kc, rcs <= rc_hi, epoch)


#: Flags :func:`wait_all_k` polls at once.
WAIT_ALL_WIDTH = tl.constexpr(64)


@triton.jit
def wait_all_k(flags_ptr, epoch, src, first_row, last_row, rcw, n_rc, n_kc):
    """Wait for every K chunk of the row chunks of ``src`` covering shard rows ``first_row..last_row``:
    their flags (``[src, rc, kc]``, K chunk fastest) are one contiguous run."""
    lo = (src * n_rc + first_row // rcw) * n_kc
    hi = (src * n_rc + last_row // rcw) * n_kc + n_kc - 1
    for f0 in range(lo, hi + 1, WAIT_ALL_WIDTH):
        fs = f0 + tl.arange(0, WAIT_ALL_WIDTH)
        spin_until(flags_ptr + fs, fs <= hi, epoch)


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
def consume_tiles(
    first_tile,
    num_consumers,
    queue_ptr,
    a_ptr,
    inbox_ptr,
    b_ptr,
    c_ptr,
    flags_ptr,
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
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    ALIGNED: tl.constexpr,
    PREFETCH_K: tl.constexpr = 0,
    B_ROW_MAJOR: tl.constexpr = True,
    WHOLE_K: tl.constexpr = False,
    DYNAMIC: tl.constexpr = False,
):
    """The consumer (GEMM) side: persistent loop over output tiles, waiting per chunk for peers' A.

    Tile ``first_tile`` first, then every ``num_consumers``-th tile after it, or (``DYNAMIC``) tile
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
    flags ``flags_ptr`` (``(WORLD_SIZE, n_rc, n_kc)``). A is addressed as ``a_ptr + row_off + k``
    with ``row_off`` chosen by selects, never by a branch: a branch-yielded offset loses its alignment
    hint, A's loads then fall back to 2-byte accesses the software pipeline cannot issue as
    ``cp.async``, and the MMA runs synchronously (measured: gather_dim=1 at 8x the GEMM's time).
    """
    ELEM: tl.constexpr = a_ptr.dtype.element_ty.primitive_bitwidth // 8
    VEC: tl.constexpr = 16 // ELEM
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # the inbox slot as an element offset from A: one address expression serves local and peers' rows
    inbox = (tl.cast(inbox_ptr, tl.int64) - tl.cast(a_ptr, tl.int64)) // ELEM
    # gather_dim=0: start at the first row tile holding local rows, then the next ranks' rows.
    first_local_m = (rank * Ms) // BLOCK_M
    # K loops per tile (segment), the columns each covers, and the K chunks waited for before each
    loops = n_kc
    span = kcw
    if WHOLE_K:
        loops = 1
        span = Ks
    group = GROUP_M
    if GATHER_DIM == 0:
        if not WHOLE_K:  # WHOLE_K: all data lands at once; a wider group reads B fewer times
            group = tl.minimum(group, tl.maximum(Ms // BLOCK_M, 1))
    tile_id = first_tile
    while tile_id < num_pid_m * num_pid_n:
        if DYNAMIC:  # ask for the next tile now: the atomic's round trip overlaps this tile's work
            next_tile = num_consumers + tl.atomic_add(queue_ptr, 1, sem="relaxed", scope="gpu")
        else:
            next_tile = tile_id + num_consumers
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, group)
        if GATHER_DIM == 0:
            pid_m = rotate(pid_m, first_local_m, num_pid_m)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        rows = tl.where(offs_m < M, offs_m, M - 1).to(tl.int64)
        first_row = pid_m * BLOCK_M
        last_row = tl.minimum(first_row + BLOCK_M, M) - 1
        b_cols = b_ptr + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GATHER_DIM == 0:
            owner = rows // Ms
            lrow = rows - owner * Ms
            row_off = tl.where(owner == rank, lrow * stride_am, inbox + rows * Ks)
            if ALIGNED:  # every row starts on 16 bytes; in this function, since the hint marks
                row_off = tl.multiple_of(row_off, VEC)  # the op defining the value (none for an argument)
            src_lo = first_row // Ms
            src_hi = last_row // Ms
            if PREFETCH_K > 0:
                if src_lo != rank or src_hi != rank:  # this tile waits for peers' rows: meanwhile
                    prefetch_b_rows(
                        b_ptr, pid_n, N, K, stride_bk, stride_bn, PREFETCH_K, BLOCK_N, B_ROW_MAJOR
                    )
            # One K loop per tile (a second call site would double the pipeline's shared memory):
            # K chunk by K chunk, waiting only for peers' rows (WHOLE_K: every chunk first, then one
            # loop over K); tiles of local rows never wait.
            for kc in range(0, loops):
                k_lo = kc * kcw
                k_hi = tl.minimum(k_lo + span, K)
                for src in range(src_lo, src_hi + 1):
                    if src != rank:
                        lo = tl.maximum(first_row - src * Ms, 0)
                        hi = tl.minimum(last_row - src * Ms, Ms - 1)
                        if WHOLE_K:
                            wait_all_k(flags_ptr, epoch, src, lo, hi, rcw, n_rc, n_kc)
                        else:
                            wait_rows(flags_ptr, epoch, src, lo, hi, kc, rcw, n_rc, n_kc)
                a_ptrs = a_ptr + row_off[:, None] + (k_lo + offs_k)[None, :]
                b_ptrs = b_cols + (k_lo + offs_k)[:, None] * stride_bk
                acc = mma_k_range(
                    acc, a_ptrs, b_ptrs, k_lo, k_hi, 1, stride_bk, mask_n, BLOCK_K, EVEN_K, EVEN_N
                )
        else:
            # gather_dim=1: the local K-slice first, then the peers' slices in rank-rotated order.
            for step in range(0, WORLD_SIZE):
                src = rotate(rank, step, WORLD_SIZE)
                local = src == rank
                base = tl.where(local, 0, inbox + tl.cast(src, tl.int64) * Ms * Ks)
                row_stride = tl.cast(tl.where(local, stride_am, Ks), tl.int64)
                row_off = base + rows * row_stride
                if ALIGNED:
                    row_off = tl.multiple_of(row_off, VEC)
                for kc in range(0, loops):
                    k_lo = kc * kcw
                    k_hi = tl.minimum(k_lo + span, Ks)
                    if not local:
                        if WHOLE_K:
                            wait_all_k(flags_ptr, epoch, src, first_row, last_row, rcw, n_rc, n_kc)
                        else:
                            wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, rcw, n_rc, n_kc)
                    a_ptrs = a_ptr + row_off[:, None] + (k_lo + offs_k)[None, :]
                    b_ptrs = b_cols + (src * Ks + k_lo + offs_k)[:, None] * stride_bk
                    acc = mma_k_range(
                        acc, a_ptrs, b_ptrs, k_lo, k_hi, 1, stride_bk, mask_n, BLOCK_K, EVEN_K, EVEN_N
                    )
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
        tile_id = next_tile


@triton.jit
def copy_chunk(
    src_ptr,
    src_off,
    src_stride,
    dst_ptr,
    dst_off,
    r0,
    r1,
    k0,
    k1,
    Ks,
    ALIGNED: tl.constexpr,
    P_ROWS: tl.constexpr,
    P_COLS: tl.constexpr,
):
    """Copy rows ``r0..r1``, columns ``k0..k1`` of a shard into an inbox slot (row stride ``Ks``).

    Element ``(r, k)`` is read at ``src_ptr + src_off + r * src_stride + k`` and written at
    ``dst_ptr + dst_off + r * Ks + k``; the scalar offsets carry a peer's heap translation, so one
    helper serves local staging, remote stores (push) and remote loads (pull), all 16-byte vectors
    when ``ALIGNED``.
    """
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
def chunk_bounds(chunk, Ms, Ks, rcw, n_rc, kcw):
    """Rows ``r0..r1`` and columns ``k0..k1`` (half-open) of chunk number ``chunk`` (K-chunk major)."""
    kc = chunk // n_rc
    rc = chunk % n_rc
    r0 = rc * rcw
    k0 = kc * kcw
    return rc, kc, r0, tl.minimum(r0 + rcw, Ms), k0, tl.minimum(k0 + kcw, Ks)


@triton.jit
def produce_chunks(
    pid,
    movers,
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
    PULL: tl.constexpr,
):
    """Move chunks ``pid, pid + movers, ...`` of the local shard (K-chunk major), each followed by a CTA
    barrier and one release (system scope) of its flag at ``epoch``.

    Push (step 1): store each chunk into slot ``rank`` of every peer's inbox and raise its flag there.
    Pull: step 1 stages each chunk in the local inbox's slot ``rank`` and raises the local flag (never
    waits); step 2 waits (acquire, system scope) for each peer's staging flag of the chunk, loads the
    chunk from the peer's slot into the local inbox and raises the local flag the consumers wait on.
    Remote addresses are the heap translation of ``iris.store``/``iris.load``, hoisted out of the copy.
    """
    slot_elems = tl.cast(Ms, tl.int64) * Ks
    own = tl.cast(rank, tl.int64) * slot_elems  # this rank's slot in every inbox
    if STEPS & 1:
        for chunk in range(pid, n_rc * n_kc, movers):
            rc, kc, r0, r1, k0, k1 = chunk_bounds(chunk, Ms, Ks, rcw, n_rc, kcw)
            flag = flags_ptr + (rank * n_rc + rc) * n_kc + kc
            if PULL:
                copy_chunk(a_ptr, 0, stride_am, inbox_ptr, own, r0, r1, k0, k1, Ks, ALIGNED, P_ROWS, P_COLS)
                tl.debug_barrier()  # all of this CTA's stores precede the single release below
                tl.atomic_xchg(flag, epoch, sem="release", scope="sys")
            else:
                for i in tl.static_range(1, WORLD_SIZE):
                    dst = own + heap_delta(inbox_ptr, rank, (rank + i) % WORLD_SIZE, heap_bases)
                    copy_chunk(
                        a_ptr, 0, stride_am, inbox_ptr, dst, r0, r1, k0, k1, Ks, ALIGNED, P_ROWS, P_COLS
                    )
                tl.debug_barrier()  # all of this CTA's stores precede the single release below
                for i in tl.static_range(1, WORLD_SIZE):
                    iris.atomic_xchg(
                        flag, epoch, rank, (rank + i) % WORLD_SIZE, heap_bases, sem="release", scope="sys"
                    )
    if PULL:
        if STEPS & 2:
            for chunk in range(pid, n_rc * n_kc, movers):
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
def fused_ag_gemm_kernel(
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
):
    """``C = all_gather(A) @ B`` on one rank: program ids below ``num_producers`` move the local shard
    (push or pull, :func:`produce_chunks`) and then join the GEMM; the others run it from the start.

    ``num_producers == 0``: every program moves its share of the chunks first, then runs its tiles,
    each waiting once for all K chunks of the peers' rows it needs (``WHOLE_K``: one pipelined K loop
    per tile). ``STEPS``
    (bits: 1 stage/store, 2 pull's fetch, 4 the GEMM) lets the interpreter run the steps as separate
    launches; every program counts its arrival in the launch that runs the GEMM.
    """
    pid = tl.program_id(0)
    grid = num_producers + num_consumers  # the GEMM launch's grid (the interpreter's earlier steps: fewer)
    epoch, flags, inbox = begin_call(
        sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, grid, WORLD_SIZE, (STEPS & 4) != 0
    )
    dedicated = pid < num_producers
    if STEPS & 3:
        if dedicated | (num_producers == 0):
            movers = tl.where(num_producers > 0, num_producers, num_consumers)
            produce_chunks(
                pid, movers, a_ptr, inbox, flags, heap_bases, rank, epoch, Ms, Ks, rcw, n_rc, kcw, n_kc,
                stride_am, WORLD_SIZE, ALIGNED, P_ROWS, P_COLS, STEPS, PULL,
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
        consume_tiles(
            first_tile, offset, queue, a_ptr, inbox, b_ptr, c_ptr, flags, rank, epoch, M, N, K,
            Ms, Ks, rcw, n_rc, kcw, n_kc, stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
            GATHER_DIM, WORLD_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, EVEN_N, ALIGNED,
            PREFETCH_K, B_ROW_MAJOR, WHOLE_K, DYNAMIC=not WHOLE_K,
        )  # fmt: skip
