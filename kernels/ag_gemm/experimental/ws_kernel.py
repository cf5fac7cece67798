"""Warp-specialised all-gather GEMM consumer for Hopper (Gluon): one load warp waits, MMA warps never do.

A persistent GEMM over ``cat_r(A_r, gather_dim) @ B`` whose A rows come from this rank's shard (local) or
from ``push``'s inbox, which peers' producers fill chunk by chunk. Each CTA runs two partitions:

* **load** (1 warp, few registers): walks the CTA's tiles and their K steps and issues one TMA load of
  A and one of B per step into a ring of ``STAGES`` shared-memory slots. Before the first step that
  reads a peer's chunk it acquires that chunk's flag (acquire loads at system scope until the flag
  reaches the call's epoch). Only this warp ever waits for a peer, at the granularity of the transfer
  (row chunk x K chunk), while the MMA warps keep consuming the slots already loaded;
* **MMA** (``MMA_WGS`` warpgroups, the kernel's ``num_warps``): wait for a slot, run asynchronous
  ``wgmma`` on it, hand the previous step's slot back (after a partition barrier when two warpgroups
  share it), and store the tile.

The buffers are ``push``'s (:mod:`..protocol`): flags ``[parity, src, rc, kc]`` (``>= epoch`` once
rows ``rc * rcw ..`` and K columns ``kc * kcw ..`` of ``A_src`` are in the inbox), the inbox
``[parity, src, Ms, Ks]`` and the arrival count ``sync[0]``, from which ``epoch = sync[0] // arrivals + 1``
as in ``push``'s kernel; the launcher counts a call's arrivals before launching the producers and this
kernel, so both read the same epoch, and graph replays advance it.

With ``FORWARD`` (``push_ws_fwd``, two ranks) there is no producer at all: a third partition, the
**forward** warp, TMA-stores each box of the local shard that a local tile has just loaded for its own
MMAs straight from the ring slot into the peer's inbox (each box by one tile: the tile whose column
block is the box's K step modulo the column blocks), and releases the box's flag (system scope) once
it is written. The slot goes back to the loader only when both the MMA warps and the forward warp are
done with it. The peer's tiles then trail this rank's by about one store's latency, no SM's threads copy,
and the shard is read from memory once. The forwarding tiles never wait, so every box is sent: at
gather_dim=0 the launcher orders all local tiles first when the tiles take more than one wave, and at
gather_dim=1 (where every tile forwards and waits) it allows one wave only.

gather_dim=0 tiles must not straddle two ranks' rows (``Ms % BLOCK_M == 0``); gather_dim=1 takes any M.
Ragged K and N edges are zero-filled by TMA. NVIDIA sm_90 only (``wgmma``, TMA, ``setmaxnreg``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ...common.watch import (
    _ALARM,
    _BOUND,
    _EXPECTED,
    _GAVE_UP,
    _INDEX,
    _PEER,
    _SEEN,
    _WRITTEN,
    CHECK_AFTER_NS,
)

# names that moved between triton 3.6 and 3.9: the partition's barrier and the TMA load
_partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _cdiv(x, d):
    return (x + d - 1) // d


@gluon.jit
def _schedule(M, N, K, Ms, Ks, rank, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              GATHER_DIM: gl.constexpr):  # fmt: skip
    """``(num_pid_m, num_pid_n, first_m, k_steps)``: the tile grid, the row block the rotation starts at
    (gather_dim=0: this rank's rows first) and the K steps per source slice (gather_dim=1: one slice of
    ``Ks`` columns per rank, local first; gather_dim=0: one slice of all ``K``)."""
    first_m = 0
    if GATHER_DIM == 0:
        first_m = (rank * Ms) // BLOCK_M
        k_steps = _cdiv(K, BLOCK_K)
    else:
        k_steps = _cdiv(Ks, BLOCK_K)
    return _cdiv(M, BLOCK_M), _cdiv(N, BLOCK_N), first_m, k_steps


@gluon.jit
def _call_epoch(sync_ptr, arrivals):
    """``(epoch, parity)`` of this call, from ``push``'s arrival count (counted before the launch)."""
    epoch = (gl.load(sync_ptr, volatile=True) // arrivals + 1).to(gl.int32)
    return epoch, epoch % 2


@gluon.jit
def _tile_of(t, num_pid_m, num_pid_n, group_m, first_m):
    """``(pid_m, pid_n)`` of the ``t``-th tile: grouped order, row blocks rotated by ``first_m``."""
    width = group_m * num_pid_n
    first = (t // width) * group_m
    size = gl.minimum(num_pid_m - first, group_m)
    pid_m = first + (t % width) % size
    pid_n = (t % width) // size
    return (pid_m + first_m) % num_pid_m, pid_n


#: Flags one poll of the load warp reads at once (2 per thread).
POLL_WIDTH = gl.constexpr(64)


@gluon.jit
def _landed_chunks(flags_ptr, epoch, src, row_lo, row_hi, rcw, n_rc, n_kc):
    """How many leading K chunks of ``src``'s rows ``row_lo..row_hi`` have landed (every row chunk's flag
    at ``epoch``): one acquire load (system scope) per flag, the warp's threads side by side, so a poll
    costs one round trip per ``POLL_WIDTH`` flags. The flags ``[src, rc, kc]`` of those row chunks are
    one contiguous run (K chunk fastest)."""
    layout: gl.constexpr = gl.BlockedLayout([2], [32], [1], [0])
    lo = (src * n_rc + row_lo // rcw) * n_kc
    hi = (src * n_rc + row_hi // rcw) * n_kc + n_kc - 1
    landed = n_kc
    for f0 in range(lo, hi + 1, POLL_WIDTH):
        idx = f0 + gl.arange(0, POLL_WIDTH, layout=layout)
        live = idx <= hi
        seen = gl.atomic_add(flags_ptr + idx, gl.zeros_like(idx), mask=live, sem="acquire", scope="sys")
        missing = live & (seen < epoch)
        first_missing = gl.min(gl.where(missing, idx % n_kc, gl.zeros_like(idx) + n_kc), axis=0)
        if first_missing < landed:
            landed = first_missing
    # the data was written through the generic proxy (peers' stores) and is read by TMA (the async proxy):
    # order the acquires above before those reads
    fence: gl.constexpr = "fence.proxy.async.global;\n\tmov.u32 $0, $1;"
    gl.inline_asm_elementwise(fence, "=r,r", [landed], dtype=gl.int32, is_pure=False, pack=1)
    return landed


@gluon.jit
def _now_ns(dep):
    """``%globaltimer`` (ns); ``dep`` only orders the read after the value it depends on."""
    asm: gl.constexpr = "mov.u64 $0, %globaltimer;"
    return gl.inline_asm_elementwise(asm, "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _give_up(watch_ptr, peer, index, expected, seen):
    """``kernels/common/watch.py``'s record of a wait that gave up, for Gluon: the first of the slot writes
    peer, flag, epoch and last read; every one raises the process's alarm (system scope)."""
    n = gl.atomic_add(watch_ptr + _GAVE_UP, 1, sem="relaxed", scope="sys")
    if n == 0:
        gl.store(watch_ptr + _PEER, peer.to(gl.int64))
        gl.store(watch_ptr + _INDEX, index.to(gl.int64))
        gl.store(watch_ptr + _EXPECTED, expected.to(gl.int64))
        gl.store(watch_ptr + _SEEN, seen.to(gl.int64))
        gl.atomic_xchg(watch_ptr + _WRITTEN, 1, sem="release", scope="sys")
    alarm = gl.load(watch_ptr + _ALARM).to(gl.pointer_type(gl.int64))
    gl.atomic_add(alarm, 1, sem="release", scope="sys")


@gluon.jit
def _await_chunks(flags_ptr, epoch, src, row_lo, row_hi, rcw, n_rc, n_kc, need, watch_ptr, ok):
    """``(landed, ok)``: poll until ``need`` leading K chunks of ``src``'s rows have landed, at most the
    watch slot's bound (``kernels/common/watch.py``). Once a wait gave up (``ok`` 0) the loader polls once
    and goes on as if the chunks had landed, so the kernel ends (its result is wrong; the host raises)."""
    landed = _landed_chunks(flags_ptr, epoch, src, row_lo, row_hi, rcw, n_rc, n_kc)
    if (landed < need) & (ok != 0):
        t0 = _now_ns(landed)
        while (landed < need) & (ok != 0):
            landed = _landed_chunks(flags_ptr, epoch, src, row_lo, row_hi, rcw, n_rc, n_kc)
            if landed < need:
                waited = _now_ns(landed) - t0
                if waited > CHECK_AFTER_NS:
                    if waited > gl.load(watch_ptr + _BOUND, volatile=True):
                        first = (src * n_rc + row_lo // rcw) * n_kc + landed
                        _give_up(watch_ptr, src, first, epoch, landed)
                        ok = 0
    if ok == 0:
        landed = n_kc
    return landed, ok


@gluon.jit
def _load_partition(a_desc, inbox_desc, b_desc, a_bufs, b_bufs, ready, empty, flags_ptr, sync_ptr, arrivals,
                    watch_ptr, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, group_m, GATHER_DIM: gl.constexpr,
                    WORLD_SIZE: gl.constexpr, WAIT: gl.constexpr, B_ROW_MAJOR: gl.constexpr):  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1] if B_ROW_MAJOR else b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    epoch, parity = _call_epoch(sync_ptr, arrivals)
    flags_ptr += parity * (WORLD_SIZE * n_rc * n_kc)
    slot0 = parity * WORLD_SIZE  # the inbox rows of this call: slots (parity, src)
    num_pid_m, num_pid_n, first_m, k_steps = _schedule(M, N, K, Ms, Ks, rank, BLOCK_M, BLOCK_N, BLOCK_K,
                                                       GATHER_DIM)  # fmt: skip
    slices = 1 if GATHER_DIM == 0 else WORLD_SIZE
    it = 0
    ok = 1  # 0 once a wait on a peer gave up
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, num_pid_m, num_pid_n, group_m, first_m)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for step in range(0, slices):
            if GATHER_DIM == 0:
                src = off_m // Ms
                row = off_m - src * Ms  # in src's shard
                b_k0 = 0
                k_len = K
            else:
                src = (rank + step) % WORLD_SIZE
                row = off_m
                b_k0 = src * Ks
                k_len = Ks
            row_hi = gl.minimum(row + BLOCK_M, Ms) - 1  # a shard has Ms rows (= M at gather_dim=1)
            inbox_row = (slot0 + src) * Ms + row
            local = src == rank
            landed = 0  # leading K chunks of this tile's rows known to have landed
            for ks in range(0, k_steps):
                k = ks * BLOCK_K
                if WAIT:
                    if not local:
                        need = (gl.minimum(k + BLOCK_K, k_len) - 1) // kcw + 1
                        if landed < need:
                            landed, ok = _await_chunks(flags_ptr, epoch, src, row, row_hi, rcw, n_rc, n_kc,
                                                       need, watch_ptr, ok)  # fmt: skip
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, nbytes)
                if local:
                    _tma_load(a_desc, [row, k], bar, a_bufs.index(s))
                else:
                    _tma_load(inbox_desc, [inbox_row, k], bar, a_bufs.index(s))
                if B_ROW_MAJOR:
                    _tma_load(b_desc, [b_k0 + k, off_n], bar, b_bufs.index(s))
                else:
                    _tma_load(b_desc, [off_n, b_k0 + k], bar, b_bufs.index(s))
                it += 1


@gluon.jit
def _push_share(a_ptr, stride_am, inbox_ptr, flags_ptr, heap_bases, rank, epoch, Ms, Ks, rcw, n_rc, kcw, n_kc,
                WORLD_SIZE: gl.constexpr, NUM_WARPS: gl.constexpr):  # fmt: skip
    """This CTA's share of ``push``'s transfer (``comm_sms=0``): chunks ``pid, pid + grid, ..`` of the local
    shard (K-chunk major, as ``push``'s producers order them) stored into slot ``rank`` of every peer's
    inbox (``inbox_ptr`` is this call's parity half), each followed by a partition barrier and one release
    (system scope) of the chunk's flag in every peer. Peers' addresses are the heap translation that
    ``iris.store`` does (``heap_bases``), as one element offset per peer and store."""
    P_ROWS: gl.constexpr = 64
    P_COLS: gl.constexpr = 128
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS, 1], [1, 0])
    rows0 = gl.expand_dims(gl.arange(0, P_ROWS, layout=gl.SliceLayout(1, layout)), 1)
    cols0 = gl.expand_dims(gl.arange(0, P_COLS, layout=gl.SliceLayout(0, layout)), 0)
    elem: gl.constexpr = a_ptr.dtype.element_ty.primitive_bitwidth // 8
    own = inbox_ptr + gl.to_tensor(rank).to(gl.int64) * Ms * Ks  # this rank's slot, in this process's mapping
    base = gl.load(heap_bases + rank)
    for chunk in range(gl.program_id(0), n_rc * n_kc, gl.num_programs(0)):
        kc = chunk // n_rc
        rc = chunk % n_rc
        r1 = gl.minimum(rc * rcw + rcw, Ms)
        k1 = gl.minimum(kc * kcw + kcw, Ks)
        for r in range(rc * rcw, r1, P_ROWS):
            for c in range(kc * kcw, k1, P_COLS):
                rows = r + rows0
                cols = c + cols0
                mask = (rows < r1) & (cols < k1)
                vals = gl.load(a_ptr + rows.to(gl.int64) * stride_am + cols, mask=mask)
                for i in gl.static_range(1, WORLD_SIZE):
                    delta = (gl.load(heap_bases + (rank + i) % WORLD_SIZE) - base) // elem
                    gl.store(own + delta + rows.to(gl.int64) * Ks + cols, vals, mask=mask)
        _partition_barrier()  # every thread's stores of the chunk precede the releases below
        flag = flags_ptr + (rank * n_rc + rc) * n_kc + kc
        for i in gl.static_range(1, WORLD_SIZE):
            delta = (gl.load(heap_bases + (rank + i) % WORLD_SIZE) - base) // 4
            gl.atomic_xchg(flag + delta, epoch, sem="release", scope="sys")


@gluon.jit
def _release_written(flag, epoch):
    """Wait until this thread's bulk stores have been written (not just read), order them (made by the
    async proxy) before a release of ``flag`` at ``epoch`` (system scope)."""
    asm: gl.constexpr = "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, $1;"
    done = gl.inline_asm_elementwise(asm, "=r,r", [epoch], dtype=gl.int32, is_pure=False, pack=1)
    _partition_barrier()  # every lane's wait (the issuing lane's counts) before the release
    gl.atomic_xchg(flag, done, sem="release", scope="sys")


#: Ring steps a forwarded box's flag waits before its release (its store is then long written), unless
#: the next forwarded box or a step reading a peer's data comes first.
RELEASE_AFTER = gl.constexpr(4)


@gluon.jit
def _release_due(pending, pending_it, it, mine, peer_step, release_after):
    """Whether the forward warp releases its pending box's flag (``pending >= 0``, stored at ring step
    ``pending_it``) before it waits for step ``it``'s slot: before its next store (``mine``), once
    ``release_after`` steps have passed, and always before a step that reads a peer's data
    (``peer_step``). That slot is filled only once the peer's flags are up, and the peer's forward warp
    may itself hold the flag this rank waits for until it gets past the same kind of step: holding a
    release across such a wait closes a cycle (two ranks, gather_dim=1, a K slice of at most
    ``release_after`` steps: every tile's last box was released only from a peer step, so both ranks
    waited for each other for ever). Plain arithmetic, so :mod:`autotaxer.tools.ws_model` runs it too."""
    return (pending >= 0) & (mine | peer_step | (it - pending_it >= release_after))


@gluon.jit
def _forward_partition(peer0_desc, peer1_desc, a_bufs, b_bufs, ready, empty, flags_ptr, heap_bases, sync_ptr,
                       arrivals, rank, M, N, K, Ms, Ks, n_rc, n_kc, group_m, GATHER_DIM: gl.constexpr,
                       WORLD_SIZE: gl.constexpr, B_ROW_MAJOR: gl.constexpr):  # fmt: skip
    """Walk the ring as the MMA warps do; for each box of the local shard this CTA is to forward (a local
    tile's step ``ks`` with ``ks % num_pid_n == pid_n``: each box once), TMA-store the slot into this
    rank's slot of the peer's inbox (``peer{parity}_desc``), wait until the store has read it, then hand
    the slot back (every slot gets this warp's arrival). A box's flag ``[rank, row // BLOCK_M, ks]`` in the
    peer is released once its store has been written: a few steps later, before the next store, or before
    the first step that reads a peer's data, whichever comes first (:func:`_release_due`)."""
    BLOCK_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2] if B_ROW_MAJOR else b_bufs.shape[1]
    STAGES: gl.constexpr = a_bufs.shape[0]
    epoch, parity = _call_epoch(sync_ptr, arrivals)
    peer = (rank + 1) % WORLD_SIZE
    delta = (gl.load(heap_bases + peer) - gl.load(heap_bases + rank)) // 4
    flags = flags_ptr + parity * (WORLD_SIZE * n_rc * n_kc) + rank * n_rc * n_kc + delta
    num_pid_m, num_pid_n, first_m, k_steps = _schedule(M, N, K, Ms, Ks, rank, BLOCK_M, BLOCK_N, BLOCK_K,
                                                       GATHER_DIM)  # fmt: skip
    slices = 1 if GATHER_DIM == 0 else WORLD_SIZE
    it = 0
    pending = -1  # the flag of a forwarded box not yet released
    pending_it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, num_pid_m, num_pid_n, group_m, first_m)
        off_m = pid_m * BLOCK_M
        for step in range(0, slices):
            if GATHER_DIM == 0:
                src = off_m // Ms
                row = off_m - src * Ms
            else:
                src = (rank + step) % WORLD_SIZE
                row = off_m
            for ks in range(0, k_steps):
                s = it % STAGES
                mine = (src == rank) & (ks % num_pid_n == pid_n)
                # decided before the wait below: a peer step's slot may wait for the peer
                if _release_due(pending, pending_it, it, mine, src != rank, RELEASE_AFTER):
                    _release_written(flags + pending, epoch)
                    pending = -1
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                if mine:
                    if parity == 0:
                        _tma_store(peer0_desc, [row, ks * BLOCK_K], a_bufs.index(s))
                    else:
                        _tma_store(peer1_desc, [row, ks * BLOCK_K], a_bufs.index(s))
                    tma.store_wait(0)  # the store has read the slot
                    pending = (row // BLOCK_M) * n_kc + ks
                    pending_it = it
                mbarrier.arrive(empty.index(s))
                it += 1
    if pending >= 0:
        _release_written(flags + pending, epoch)


@gluon.jit
def _mma_partition(c_ptr, a_ptr, stride_am, inbox_ptr, flags_ptr, heap_bases, sync_ptr, arrivals, a_bufs,
                   b_bufs, ready, empty, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, stride_cm, stride_cn,
                   group_m, GATHER_DIM: gl.constexpr, WORLD_SIZE: gl.constexpr, B_ROW_MAJOR: gl.constexpr,
                   MMA_WGS: gl.constexpr, PRODUCE: gl.constexpr):  # fmt: skip
    """With ``PRODUCE``, this CTA's share of the transfer first (:func:`_push_share`; the load warp is
    already loading local tiles meanwhile); then every tile's MMAs and store (``MMA_WGS`` warpgroups)."""
    if PRODUCE:
        epoch, parity = _call_epoch(sync_ptr, arrivals)
        inbox = inbox_ptr + parity.to(gl.int64) * (WORLD_SIZE * Ms) * Ks
        flags = flags_ptr + parity * (WORLD_SIZE * n_rc * n_kc)
        _push_share(a_ptr, stride_am, inbox, flags, heap_bases, rank, epoch, Ms, Ks, rcw, n_rc, kcw, n_kc,
                    WORLD_SIZE, 4 * MMA_WGS)  # fmt: skip
    BLOCK_M: gl.constexpr = a_bufs.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    BLOCK_N: gl.constexpr = b_bufs.shape[2] if B_ROW_MAJOR else b_bufs.shape[1]
    STAGES: gl.constexpr = a_bufs.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4 * MMA_WGS, 1], instr_shape=[16, BLOCK_N, 16]
    )
    num_pid_m, num_pid_n, first_m, k_steps = _schedule(M, N, K, Ms, Ks, rank, BLOCK_M, BLOCK_N, BLOCK_K,
                                                       GATHER_DIM)  # fmt: skip
    steps = k_steps if GATHER_DIM == 0 else WORLD_SIZE * k_steps
    it = 0
    for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, num_pid_m, num_pid_n, group_m, first_m)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
        for ks in range(0, steps):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            a = a_bufs.index(s)
            if B_ROW_MAJOR:
                b = b_bufs.index(s)
            else:
                b = b_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
            if MMA_WGS > 1:  # every warpgroup's previous wgmma is done, not just the arriving thread's
                _partition_barrier()
            # the previous step's wgmma has finished reading its slot: hand it back to the loader
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=ks > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        if MMA_WGS > 1:
            _partition_barrier()
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        ptrs = c_ptr + gl.expand_dims(rows, 1).to(gl.int64) * stride_cm + gl.expand_dims(cols, 0) * stride_cn
        mask = (gl.expand_dims(rows, 1) < M) & (gl.expand_dims(cols, 0) < N)
        gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def ag_gemm_ws_kernel(a_desc, inbox_desc, b_desc, peer0_desc, peer1_desc, c_ptr, a_ptr, inbox_ptr, heap_bases,
                      flags_ptr, sync_ptr, watch_ptr, arrivals, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc,
                      group_m, stride_am, stride_cm, stride_cn, GATHER_DIM: gl.constexpr,
                      WORLD_SIZE: gl.constexpr, WAIT: gl.constexpr, B_ROW_MAJOR: gl.constexpr,
                      STAGES: gl.constexpr, MMA_WGS: gl.constexpr, LOAD_REGS: gl.constexpr,
                      PRODUCE: gl.constexpr, FORWARD: gl.constexpr):  # fmt: skip
    """The persistent warp-specialised GEMM; launch with ``num_warps = 4 * MMA_WGS`` (the MMA partition).
    The load warp's waits on peers give up after the bound of the watch slot ``watch_ptr``.
    ``FORWARD``: with the forward warp (:func:`_forward_partition`; ``peer{0,1}_desc`` are this rank's
    slot of the peer's inbox at each parity, unread otherwise)."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 if FORWARD else 1)  # FORWARD: the forward warp's arrival too
    # the argument tuples are written inline: a tuple bound to a name first loses its constexprs
    if FORWARD:
        gl.warp_specialize(
            [
                (_mma_partition, (
                    c_ptr, a_ptr, stride_am, inbox_ptr, flags_ptr, heap_bases, sync_ptr, arrivals, a_bufs,
                    b_bufs, ready, empty, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, stride_cm, stride_cn,
                    group_m, GATHER_DIM, WORLD_SIZE, B_ROW_MAJOR, MMA_WGS, PRODUCE)),
                (_load_partition, (
                    a_desc, inbox_desc, b_desc, a_bufs, b_bufs, ready, empty, flags_ptr, sync_ptr, arrivals,
                    watch_ptr, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, group_m, GATHER_DIM, WORLD_SIZE,
                    WAIT, B_ROW_MAJOR)),
                (_forward_partition, (
                    peer0_desc, peer1_desc, a_bufs, b_bufs, ready, empty, flags_ptr, heap_bases, sync_ptr,
                    arrivals, rank, M, N, K, Ms, Ks, n_rc, n_kc, group_m, GATHER_DIM, WORLD_SIZE,
                    B_ROW_MAJOR)),
            ],
            [1, 1],
            [LOAD_REGS, LOAD_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_mma_partition, (
                    c_ptr, a_ptr, stride_am, inbox_ptr, flags_ptr, heap_bases, sync_ptr, arrivals, a_bufs,
                    b_bufs, ready, empty, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, stride_cm, stride_cn,
                    group_m, GATHER_DIM, WORLD_SIZE, B_ROW_MAJOR, MMA_WGS, PRODUCE)),
                (_load_partition, (
                    a_desc, inbox_desc, b_desc, a_bufs, b_bufs, ready, empty, flags_ptr, sync_ptr, arrivals,
                    watch_ptr, rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc, group_m, GATHER_DIM, WORLD_SIZE,
                    WAIT, B_ROW_MAJOR)),
            ],
            [1],
            [LOAD_REGS],
        )  # fmt: skip
