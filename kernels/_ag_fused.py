"""Building blocks shared by the fused ag_gemm kernels (``ag_gemm_pull``, ``ag_gemm_push``).

Both kernels fill the same per-rank inbox (``2 parity x WORLD_SIZE x Ms x Ks`` in the symmetric heap;
slot ``src`` holds rank ``src``'s shard) and run the same consumer GEMM over it, so every remote byte
crosses NVLink/xGMI once. They differ in who moves it: push producers store the local shard into
every peer's inbox; pull producers stage the local shard in their own inbox slot, then load each
peer's staged chunks into their own inbox.

Synchronisation contract (both kernels):

* **Epoch in device memory.** ``sync[0]`` holds the last finished call's epoch; every program reads
  it at start (``epoch = sync[0] + 1``) and counts itself done in ``sync[1]`` at the end. The last
  program to finish (all others have read the epoch by then) resets the count and publishes the
  epoch. Nothing on the host changes between calls, so a captured CUDA graph replays correctly.
* **Flags by epoch, double-buffered by parity.** The shard is cut into chunks (rows x K columns,
  K-chunk major so the first K columns arrive first); flag ``[src, chunk]`` says chunk ``chunk`` of
  ``src``'s shard is in slot ``src`` of the inbox holding it. A writer copies a chunk, runs a CTA
  barrier, then one thread releases at system scope; readers spin with acquire loads at system scope
  until the flag reaches their epoch. Data and flags of call ``e`` live in slot ``e % 2``: a rank is
  at most one call ahead of a peer (each call waits for the peer's data of that call), so slot
  ``e % 2`` was last read two calls ago, which has finished on every rank. Flags are never reset.
* **No starvation.** Consumers wait only on producers; producers wait at most on the peers' producers
  in a phase that itself never waits (pull's staging), so every wait ends whatever the grid size.
  With ``comm_sms=0`` each program does its producer share before it waits on anything; the grid is
  then at most one program per SM, so all of it is resident together and no waiting program can hold
  the SM another program's share needs.

Consumers read A through per-row element offsets relative to the local shard's pointer (local rows
from the user's tensor, peers' rows from the local inbox), chosen by selects so the K loop stays one
software-pipelined loop (``cp.async`` for A and B, asynchronous ``wgmma``); ``bench/compile_hopper.py``
checks that on the sm_90 compile. Only tile sizes, schedule and world size are compile-time; shapes
and strides are runtime.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._tiles import grouped_tile, rotate
from .gemm import mma_k_range, store_tile


@triton.jit
def epoch_begin(sync_ptr):
    """This call's epoch: one more than the last finished call's (written by the previous launch)."""
    return tl.load(sync_ptr, volatile=True) + 1


@triton.jit
def epoch_end(sync_ptr, epoch, total_programs):
    """Count this program done; the last one resets the count and publishes ``epoch``."""
    tl.debug_barrier()  # every thread of this CTA is past its last use of the epoch
    done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == total_programs - 1:
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr, epoch, sem="release", scope="gpu")


@triton.jit
def begin_call(sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, WORLD_SIZE: tl.constexpr):
    """``(epoch, flags, inbox)``: this call's epoch and its parity slot of the flags and of the inbox."""
    epoch = epoch_begin(sync_ptr)
    parity = epoch % 2
    flags = flags_ptr + parity * (WORLD_SIZE * n_rc * n_kc)
    inbox = inbox_ptr + parity.to(tl.int64) * (WORLD_SIZE * Ms) * Ks
    return epoch, flags, inbox


@triton.jit
def wait_flag(flag_ptr, epoch):
    """Spin until ``*flag_ptr >= epoch`` with acquire loads at system scope (not plain volatile)."""
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys") < epoch:
        pass


@triton.jit
def heap_delta(ptr, rank, peer, heap_bases):
    """Elements from ``ptr`` to the same heap offset on ``peer`` (the translation ``iris.load`` does).

    Hoisted out of the copy loops as one scalar so the per-element address arithmetic stays
    ``base + row * stride + col`` and its alignment (and so 16-byte vector accesses) stays provable.
    """
    elem: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    return (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // elem


#: Row-chunk flags one wait polls at once (a tile spans at most ``row_chunks`` (<= 16) of them).
WAIT_WIDTH = tl.constexpr(16)


@triton.jit
def wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, rcw, n_rc, n_kc):
    """Wait for the row chunks of ``src`` covering shard rows ``first_row..last_row`` in K chunk ``kc``.

    The chunks' flags are polled together (one acquire load per flag, side by side in the CTA's
    threads) rather than one after another, so a tile spanning several chunks pays one round trip.
    """
    rc_hi = last_row // rcw
    for rc0 in range(first_row // rcw, rc_hi + 1, WAIT_WIDTH):
        rcs = rc0 + tl.arange(0, WAIT_WIDTH)
        live = rcs <= rc_hi
        ptrs = flags_ptr + (src * n_rc + rcs) * n_kc + kc
        pending = 1
        while pending > 0:
            seen = tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys")
            pending = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)


#: Flags :func:`wait_all_k` polls at once.
WAIT_ALL_WIDTH = tl.constexpr(64)


@triton.jit
def wait_all_k(flags_ptr, epoch, src, first_row, last_row, rcw, n_rc, n_kc):
    """Wait for every K chunk of the row chunks of ``src`` covering shard rows ``first_row..last_row``.

    Their flags (``[src, rc, kc]``, K chunk fastest) are one contiguous run, polled ``WAIT_ALL_WIDTH``
    at a time with acquire loads at system scope.
    """
    lo = (src * n_rc + first_row // rcw) * n_kc
    hi = (src * n_rc + last_row // rcw) * n_kc + n_kc - 1
    for f0 in range(lo, hi + 1, WAIT_ALL_WIDTH):
        fs = f0 + tl.arange(0, WAIT_ALL_WIDTH)
        live = fs <= hi
        pending = 1
        while pending > 0:
            seen = tl.atomic_add(flags_ptr + fs, 0, mask=live, sem="acquire", scope="sys")
            pending = tl.sum((live & (seen < epoch)).to(tl.int32), axis=0)


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
    cid,
    num_consumers,
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
):
    """The consumer (GEMM) side: persistent loop over output tiles, waiting per chunk for peers' A.

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
    for tile_id in range(cid, num_pid_m * num_pid_n, num_consumers):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
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


# ---------------------------------------------------------------------------------------------------
# Host side: the config both kernels share, the launch arithmetic and their public launcher.

from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from ._tiles import ChunkGeometry, chunk_geometry  # noqa: E402


@dataclass(frozen=True)
class FusedConfig:
    """Tiles and schedule of a fused ag_gemm kernel.

    ``comm_sms`` producer CTAs move the local shard (push: into the peers' inboxes; pull: into the
    local staging buffer) in ``row_chunks x k_chunks`` chunks, one flag each; the rest of the grid
    (at most ``num_sms - comm_sms`` CTAs) runs the persistent GEMM. ``comm_sms=0``: no dedicated
    producers; every program of the GEMM's grid first moves its share of the chunks (chunk ``i`` by
    program ``i % grid``), then runs its tiles, each waiting for all the K chunks of the peers' rows it
    needs before one K loop (``WHOLE_K``). Small shards are then in flight on every SM at once within
    microseconds, instead of trickling through a few producers, and no SM is withheld from the GEMM.
    ``prefetch_k`` (NVIDIA, 0 = off):
    a gather_dim=0 tile that waits for peers' rows first prefetches that many rows of its B slab into L2.
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    comm_sms: int = 8
    row_chunks: int = 4
    k_chunks: int = 1
    prefetch_k: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}: must be a power of two >= 16, got {v}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: must be a power of two <= 16, got {self.num_warps}")
        for name in ("group_m", "num_stages", "row_chunks", "k_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.comm_sms < 0:
            raise ValueError(f"comm_sms: must be >= 0, got {self.comm_sms}")
        if self.prefetch_k and (self.prefetch_k < 128 or self.prefetch_k & (self.prefetch_k - 1)):
            raise ValueError(f"prefetch_k: must be 0 or a power of two >= 128, got {self.prefetch_k}")


def inbox_shape(ms: int, ks: int, world_size: int) -> tuple[int, int, int, int]:
    """Shape of a rank's inbox: two parity slots of every rank's shard."""
    return (2, world_size, ms, ks)


def flags_count(geo: ChunkGeometry, world_size: int) -> int:
    """Number of int32 flags a rank needs: two parity slots of ``world_size x chunks``."""
    return 2 * world_size * geo.count


def smem_bytes(config: FusedConfig, elem_bytes: int) -> int:
    """Shared memory the consumer's pipelined K loop allocates: ``num_stages`` A and B tiles.

    Matches Triton's ``metadata.shared`` on sm_90 (checked by ``bench/compile_hopper.py``), where
    the epilogue reuses the pipeline's buffers; the producers' copies go through registers only.
    """
    return config.num_stages * (config.block_m + config.block_n) * config.block_k * elem_bytes


def shard_dims(m: int, k: int, world_size: int, gather_dim: int) -> tuple[int, int]:
    """``(Ms, Ks)``: the shape of one rank's shard."""
    return (m // world_size, k) if gather_dim == 0 else (m, k // world_size)


def geometry(config: FusedConfig, ms: int, ks: int) -> ChunkGeometry:
    """The chunk geometry a config gives for a ``(Ms, Ks)`` shard."""
    return chunk_geometry(ms, ks, config.row_chunks, config.k_chunks, config.block_k)


#: Launch phase -> steps run (bit 1: stage / store the own shard, bit 2: fetch peers', bit 4: the GEMM).
_PHASES = {"all": 7, "producers": 3, "stage": 1, "fetch": 2, "consumers": 4}

#: Elements one producer step moves at most (16 KiB of bf16): its loads are in flight together.
_COPY_ELEMS = 8192


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _launch_args(
    kernel,
    *,
    a_shard,
    b,
    out,
    buf,
    flags,
    sync,
    heap_bases,
    rank: int,
    world_size: int,
    gather_dim: int,
    config: FusedConfig,
    num_sms: int,
    phase: str,
) -> tuple[int, list[Any], dict[str, int]]:
    """Check shapes; ``(grid, every kernel argument in signature order, launch options)``.

    ``buf`` is the rank's inbox (:func:`inbox_shape`), ``flags`` its :func:`flags_count` int32 flags.
    ``phase`` launches part of the grid, for the interpreter, where programs run one after another
    and nothing may spin on work that has not run yet: ``"stage"`` (producers' first step: push
    stores into peers, pull stages its own shard), ``"fetch"`` (pull's loads of peers' chunks; no-op
    for push), ``"producers"`` (both), ``"consumers"``; ``"all"`` is the real launch.
    """
    config.validate()
    if gather_dim not in (0, 1):
        raise ValueError(f"gather_dim: must be 0 or 1, got {gather_dim}")
    if phase not in _PHASES:
        raise ValueError(f"phase: must be one of {', '.join(_PHASES)}, got {phase!r}")
    ms, ks = a_shard.shape
    m, n = out.shape
    k = b.shape[0]
    if (ms, ks) != shard_dims(m, k, world_size, gather_dim) or b.shape[1] != n:
        raise ValueError(
            f"shapes: shard {tuple(a_shard.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} do not "
            f"form ag_gemm(gather_dim={gather_dim}) over {world_size} ranks"
        )
    if a_shard.stride(1) != 1:
        raise ValueError("a_shard: the last dimension must be contiguous")
    if config.comm_sms >= num_sms:
        raise ValueError(f"comm_sms: {config.comm_sms} leaves no SM for the GEMM ({num_sms} SMs)")
    geo = geometry(config, ms, ks)
    if tuple(buf.shape) != inbox_shape(ms, ks, world_size) or buf.dtype != a_shard.dtype:
        raise ValueError(
            f"buf: expected {inbox_shape(ms, ks, world_size)} {a_shard.dtype}, got "
            f"{tuple(buf.shape)} {buf.dtype}"
        )
    if flags.numel() < flags_count(geo, world_size):
        raise ValueError(f"flags: {flags.numel()} flags, {flags_count(geo, world_size)} needed")
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    consumers = min(num_sms - config.comm_sms, tiles)
    producers = config.comm_sms
    if phase == "all":
        grid, offset = producers + consumers, 0
    elif phase == "consumers":
        grid, offset = consumers, producers
    else:  # the producers' steps alone: the dedicated producers, else every program's share
        grid, offset = producers or consumers, 0
    p_rows = _pow2_at_most(geo.row_width, 16)
    elem = a_shard.element_size()
    aligned = (
        (ks * elem) % 16 == 0
        and (a_shard.stride(0) * elem) % 16 == 0
        and a_shard.data_ptr() % 16 == 0
        and buf.data_ptr() % 16 == 0
    )
    values = dict(
        a_ptr=a_shard, b_ptr=b, c_ptr=out, inbox_ptr=buf, flags_ptr=flags, sync_ptr=sync,
        heap_bases=heap_bases, rank=rank, M=m, N=n, K=k, Ms=ms, Ks=ks,
        rcw=geo.row_width, n_rc=geo.n_row, kcw=geo.col_width, n_kc=geo.n_col,
        stride_am=a_shard.stride(0), stride_bk=b.stride(0), stride_bn=b.stride(1),
        stride_cm=out.stride(0), stride_cn=out.stride(1),
        pid_offset=offset, num_producers=producers, num_consumers=consumers,
        WORLD_SIZE=world_size, GATHER_DIM=gather_dim,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        P_ROWS=p_rows, P_COLS=_pow2_at_most(max(geo.col_width, 16), _COPY_ELEMS // p_rows),
        EVEN_K=ks % config.block_k == 0, EVEN_N=n % config.block_n == 0, ALIGNED=aligned,
        STEPS=_PHASES[phase],
        PREFETCH_K=config.prefetch_k, B_ROW_MAJOR=b.stride(1) == 1, WHOLE_K=producers == 0,
    )  # fmt: skip
    names = kernel.arg_names
    if set(names) != set(values):
        raise TypeError(f"{kernel.__name__}: parameters {names} do not match the launcher's {sorted(values)}")
    return (
        grid,
        [values[name] for name in names],
        {"num_warps": config.num_warps, "num_stages": config.num_stages},
    )


def _specialization(a_shard, b, out) -> tuple:
    """What Triton specialises a compiled launch on, of the per-call tensors: shapes, strides, dtypes
    and 16-byte alignment (the workspace's buffers never change under one launch cache)."""
    return (
        a_shard.shape, a_shard.stride(), a_shard.dtype, a_shard.data_ptr() & 15,
        b.shape, b.stride(), b.dtype, b.data_ptr() & 15,
        out.shape, out.stride(), out.dtype, out.data_ptr() & 15,
    )  # fmt: skip


class _CompiledLaunch:
    """One compiled kernel with its grid and arguments; a call swaps in the per-call tensors and
    launches through the compiled kernel's own launcher, skipping Triton's argument binding and
    specialisation (tens of microseconds for ~40 arguments)."""

    __slots__ = ("runner", "args")

    def __init__(self, compiled: Any, grid: int, args: list[Any]) -> None:
        self.runner = compiled[(grid, 1, 1)]
        self.args = args

    def __call__(self, a_shard: Any, b: Any, out: Any) -> None:
        args = self.args
        args[0], args[1], args[2] = a_shard, b, out
        try:
            self.runner(*args)
        finally:
            args[0] = args[1] = args[2] = None  # hold no user tensor between calls


def fused_launcher(kernel, how: str) -> Callable[..., Any]:
    """The public launcher of a fused kernel (``ag_gemm_pull``, ``ag_gemm_push``) over :func:`launch`."""
    if kernel.arg_names[:3] != ["a_ptr", "b_ptr", "c_ptr"]:
        raise TypeError(f"{kernel.__name__}: the first parameters must be a_ptr, b_ptr, c_ptr")

    def ag_gemm(
        *,
        a_shard,
        b,
        out,
        inbox,
        flags,
        sync,
        heap_bases,
        rank: int,
        world_size: int,
        gather_dim: int,
        config: FusedConfig,
        num_sms: int,
        phase: str = "all",
        cache: dict | None = None,
    ):
        fast = cache is not None and phase == "all"
        if fast:
            spec = _specialization(a_shard, b, out)
            compiled = cache.get(spec)
            if compiled is not None:
                compiled(a_shard, b, out)
                return out
        grid, args, options = _launch_args(
            kernel,
            a_shard=a_shard,
            b=b,
            out=out,
            buf=inbox,
            flags=flags,
            sync=sync,
            heap_bases=heap_bases,
            rank=rank,
            world_size=world_size,
            gather_dim=gather_dim,
            config=config,
            num_sms=num_sms,
            phase=phase,
        )
        handle = kernel[(grid,)](*args, **options)
        if fast and hasattr(handle, "run") and len(cache) < 64:  # a compiled kernel (not the interpreter)
            cache[spec] = _CompiledLaunch(handle, grid, [None, None, None, *args[3:]])
        return out

    ag_gemm.__name__ = ag_gemm.__qualname__ = f"ag_gemm_{how}"
    ag_gemm.__module__ = kernel.__module__
    ag_gemm.__doc__ = (
        f"``out = all_gather(a_shard, gather_dim) @ b`` by {how}; collective over ``world_size`` ranks.\n\n"
        "``inbox`` (:func:`inbox_shape`, A's dtype) and ``flags`` (int32, :func:`flags_count`, zeroed once)\n"
        "live in the symmetric heap; ``sync`` (int32, 2, zeroed once) holds the device-side epoch. Nothing\n"
        "is reset between calls; ``phase`` as in :func:`_launch_args`. ``cache``: a dict owned by one\n"
        "workspace (every call with it passes the same inbox, flags, sync, heap_bases, rank, world_size,\n"
        "gather_dim, config and num_sms): compiled launches by the tensors' shapes, strides, dtypes and\n"
        "alignment, "
        "so repeated calls skip the checks and Triton's argument binding."
    )
    return ag_gemm
