"""``ag_gemm`` push with split-K work pieces (experimental): every SM busy until the end, at any M.

``push`` hands out whole output tiles. At one wave of tiles (N=K=8192, M=256: 128 tiles of 128x128 on
132 SMs) every program takes one tile at once, the tiles of the peers' rows then wait for the transfer
(~10 us for 2 MiB) and finish that much after the local ones: the GEMM alone would take 54 us, the fused
kernel takes 64. Here each tile's K range is cut into ``SPLIT`` pieces, handed out by the same relaxed
atomic queue, the pieces that read only local data first (gather_dim=0: the local rows' tiles; gather_dim=1:
every tile's local K-slice), so the programs work on local pieces while the peer's data lands and take the
peers' pieces after it, and all finish within a piece of each other.

A piece stores its fp32 partial tile in ``partials`` (one slot per piece), runs a CTA barrier and counts
itself in the tile's counter (``acq_rel``); the piece that makes the count a multiple of ``SPLIT`` is the
tile's last one this call: it reads the ``SPLIT`` partials in order (deterministic sums), and stores the
output tile. Counters are never reset (each call adds exactly ``SPLIT`` to each, and ``SPLIT`` is a power of
two, so the test survives the int32 wrap-around), so CUDA-graph replay is safe, like the flags. No piece
waits on another piece; pieces wait only on producers, which never wait, and the producers (``comm_sms``
dedicated programs, ``push`` transport) join the pieces when their chunks are moved. The device epoch,
flags, inbox and producers are those of :mod:`._ag_fused_kernel`.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from . import _ag_fused
from ._ag_fused_kernel import begin_call, epoch_end, produce_chunks, wait_rows
from ._tiles import grouped_tile, rotate
from .gemm import mma_k_range, store_tile


@triton.jit
def _piece_k_range(s, K, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns ``[k_lo, k_hi)`` of piece ``s`` of ``SPLIT`` over ``K`` columns (starts on ``BLOCK_K``)."""
    width = tl.cdiv(tl.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K
    k_lo = s * width
    return k_lo, tl.minimum(k_lo + width, K)


@triton.jit
def _wait_k_range(flags_ptr, epoch, src, first_row, last_row, k_lo, k_hi, rcw, n_rc, kcw, n_kc):
    """Wait for the chunks of ``src`` covering rows ``first_row..last_row`` and columns ``[k_lo, k_hi)``."""
    for kc in range(k_lo // kcw, tl.cdiv(k_hi, kcw)):
        wait_rows(flags_ptr, epoch, src, first_row, last_row, kc, rcw, n_rc, n_kc)


@triton.jit
def _split_pieces(
    first_piece, num_consumers, queue_ptr, a_ptr, inbox_ptr, b_ptr, c_ptr, flags_ptr, part_ptr, count_ptr,
    rank, epoch, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc,
    stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
    GATHER_DIM: tl.constexpr, WORLD_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
    ALIGNED: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Run pieces ``first_piece``, then those the queue hands out, until none is left."""
    ELEM: tl.constexpr = a_ptr.dtype.element_ty.primitive_bitwidth // 8
    VEC: tl.constexpr = 16 // ELEM
    PER_SRC: tl.constexpr = SPLIT // WORLD_SIZE  # gather_dim=1: pieces per rank's K-slice
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles = num_pid_m * num_pid_n
    offs_k = tl.arange(0, BLOCK_K)
    tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    inbox = (tl.cast(inbox_ptr, tl.int64) - tl.cast(a_ptr, tl.int64)) // ELEM
    first_local_m = (rank * Ms) // BLOCK_M
    group = GROUP_M
    if GATHER_DIM == 0:  # groups never straddle two ranks' rows: the local rows' pieces come first
        group = tl.minimum(group, tl.maximum(Ms // BLOCK_M, 1))
    piece = first_piece
    while piece < tiles * SPLIT:
        next_piece = num_consumers + tl.atomic_add(queue_ptr, 1, sem="relaxed", scope="gpu")
        if GATHER_DIM == 0:
            tile_id = piece // SPLIT
            s = piece % SPLIT
        else:  # every tile's local K-slice first, then the peers' slices in rank-rotated order
            tile_id = piece % tiles
            s = piece // tiles
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
            k_lo, k_hi = _piece_k_range(s, K, SPLIT, BLOCK_K)
            owner = rows // Ms
            row_off = tl.where(owner == rank, (rows - owner * Ms) * stride_am, inbox + rows * Ks)
            for src in range(first_row // Ms, last_row // Ms + 1):
                if src != rank:
                    lo = tl.maximum(first_row - src * Ms, 0)
                    hi = tl.minimum(last_row - src * Ms, Ms - 1)
                    _wait_k_range(flags_ptr, epoch, src, lo, hi, k_lo, k_hi, rcw, n_rc, kcw, n_kc)
            k_base = 0
        else:
            src = rotate(rank, s // PER_SRC, WORLD_SIZE)
            k_lo, k_hi = _piece_k_range(s % PER_SRC, Ks, PER_SRC, BLOCK_K)
            local = src == rank
            base = tl.where(local, 0, inbox + tl.cast(src, tl.int64) * Ms * Ks)
            row_off = base + rows * tl.cast(tl.where(local, stride_am, Ks), tl.int64)
            if not local:
                _wait_k_range(flags_ptr, epoch, src, first_row, last_row, k_lo, k_hi, rcw, n_rc, kcw, n_kc)
            k_base = src * Ks
        if ALIGNED:
            row_off = tl.multiple_of(row_off, VEC)
        a_ptrs = a_ptr + row_off[:, None] + (k_lo + offs_k)[None, :]
        b_ptrs = b_cols + (k_base + k_lo + offs_k)[:, None] * stride_bk
        acc = mma_k_range(acc, a_ptrs, b_ptrs, k_lo, k_hi, 1, stride_bk, mask_n, BLOCK_K, EVEN_K, EVEN_N)
        # this piece's partial, then count it; the tile's last piece this call sums and stores
        slots = part_ptr + tl.cast(tile_id, tl.int64) * (SPLIT * BLOCK_M * BLOCK_N)
        tl.store(slots + s * (BLOCK_M * BLOCK_N) + tile_offs, acc)
        tl.debug_barrier()  # every thread's part of the partial precedes the single release below
        seen = tl.atomic_add(count_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
        if ((seen + 1) & (SPLIT - 1)) == 0:
            tl.debug_barrier()  # the acquire above precedes every thread's loads
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in tl.static_range(SPLIT):
                total += tl.load(slots + j * (BLOCK_M * BLOCK_N) + tile_offs, cache_modifier=".cg")
            store_tile(c_ptr, total, offs_m, offs_n, M, N, stride_cm, stride_cn)
        piece = next_piece


@triton.jit
def _ag_gemm_split_kernel(
    a_ptr, b_ptr, c_ptr, inbox_ptr, flags_ptr, sync_ptr, heap_bases, part_ptr, count_ptr,
    rank, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc,
    stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
    num_producers, num_consumers,
    WORLD_SIZE: tl.constexpr, GATHER_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, P_ROWS: tl.constexpr, P_COLS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, ALIGNED: tl.constexpr, STEPS: tl.constexpr,
    SPLIT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    epoch, flags, inbox = begin_call(sync_ptr, flags_ptr, inbox_ptr, Ms, Ks, n_rc, n_kc, WORLD_SIZE)
    dedicated = pid < num_producers
    if STEPS & 1:
        if dedicated:
            produce_chunks(
                pid, num_producers, a_ptr, inbox, flags, heap_bases, rank, epoch, Ms, Ks, rcw, n_rc, kcw,
                n_kc, stride_am, WORLD_SIZE, ALIGNED, P_ROWS, P_COLS, STEPS, False,
            )  # fmt: skip
    if STEPS & 4:
        queue = sync_ptr + 2
        if dedicated:  # done moving: take pieces from the queue
            first_piece = num_consumers + tl.atomic_add(queue, 1, sem="relaxed", scope="gpu")
        else:
            first_piece = pid - num_producers
        _split_pieces(
            first_piece, num_consumers, queue, a_ptr, inbox, b_ptr, c_ptr, flags, part_ptr, count_ptr,
            rank, epoch, M, N, K, Ms, Ks, rcw, n_rc, kcw, n_kc,
            stride_am, stride_bk, stride_bn, stride_cm, stride_cn,
            GATHER_DIM, WORLD_SIZE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, EVEN_N, ALIGNED, SPLIT,
        )  # fmt: skip
        epoch_end(sync_ptr, epoch, num_producers + num_consumers)


KERNEL = _ag_gemm_split_kernel


def check_split(split: int, comm_sms: int, gather_dim: int, world_size: int) -> str | None:
    """Why ``split`` pieces per tile cannot run with this producer count and layout, or ``None``."""
    if split < 2 or split & (split - 1):
        return f"split: must be a power of two >= 2, got {split}"
    if comm_sms < 1:
        return "comm_sms: the split kernel needs dedicated producers (>= 1)"
    if gather_dim == 1 and split % world_size:
        return f"split: {split} pieces do not cut {world_size} K-slices evenly (gather_dim=1)"
    return None


def partials_count(m: int, n: int, config: _ag_fused.FusedConfig, split: int) -> int:
    """fp32 elements of the partials buffer: one ``block_m x block_n`` slot per piece."""
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    return tiles * split * config.block_m * config.block_n


def counters_count(m: int, n: int, config: _ag_fused.FusedConfig) -> int:
    """int32 per-tile counters (zeroed once, never reset)."""
    return triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)


def ag_gemm_split(
    *, a_shard: Any, b: Any, out: Any, inbox: Any, flags: Any, sync: Any, heap_bases: Any, partials: Any,
    counters: Any, rank: int, world_size: int, gather_dim: int, config: _ag_fused.FusedConfig, split: int,
    num_sms: int, phase: str = "all",
) -> Any:  # fmt: skip
    """``out = all_gather(a_shard, gather_dim) @ b`` by push, in split-K pieces; collective.

    Buffers as :func:`_ag_fused.fused_launcher`'s launchers take them, plus ``partials`` (fp32,
    :func:`partials_count`) and ``counters`` (int32, :func:`counters_count`, zeroed once), both local.
    ``phase``: ``"stage"`` (producers' pushes) or ``"consumers"`` (the pieces, every program) for the
    interpreter; ``"all"`` is the real launch.
    """
    if phase not in ("all", "stage", "consumers"):
        raise ValueError(f"phase: must be all, stage or consumers, got {phase!r}")
    reason = check_split(split, config.comm_sms, gather_dim, world_size)
    if reason is not None:
        raise ValueError(reason)
    m, n = out.shape
    if partials.numel() < partials_count(m, n, config, split) or partials.dtype.itemsize != 4:
        raise ValueError(f"partials: {partials_count(m, n, config, split)} fp32 elements needed")
    if counters.numel() < counters_count(m, n, config):
        raise ValueError(f"counters: {counters_count(m, n, config)} int32 counters needed")
    # the fused kernels' checks and arguments, by name
    _, args, options = _ag_fused._launch_args(
        "push", a_shard=a_shard, b=b, out=out, buf=inbox, flags=flags, sync=sync, heap_bases=heap_bases,
        rank=rank, world_size=world_size, gather_dim=gather_dim, config=config, num_sms=num_sms, phase=phase,
    )  # fmt: skip
    values = dict(zip(_ag_fused.KERNEL.arg_names, args, strict=True))
    pieces = counters_count(m, n, config) * split
    consumers = min(num_sms - config.comm_sms, pieces)
    values.update(part_ptr=partials, count_ptr=counters, num_consumers=consumers, SPLIT=split)
    grid = config.comm_sms + consumers if phase != "stage" else config.comm_sms
    KERNEL[(grid,)](*[values[name] for name in _ag_gemm_split_kernel.arg_names], **options)
    return out
