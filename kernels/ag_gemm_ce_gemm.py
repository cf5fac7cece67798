"""Copy-engine all-gather feeding the persistent Triton GEMM: 0 SMs for communication, one GEMM launch.

Schedule of one call on rank ``r`` (the transport is :mod:`ag_gemm_ce`'s channel, unchanged):

* side stream (forked from the caller's stream): for every peer, wait until it has consumed this
  rank's previous data, then copy ``A_r`` chunk by chunk into its inbox with the copy engine and raise
  its flag ``(r, chunk)``;
* caller's stream: one persistent Triton GEMM over every SM (``_ag_fused_kernel.consume_tiles``, the consumer
  of the push/pull kernels) reading local rows / the local K-slice from ``A_r`` and peers' from the
  inbox, each tile waiting in-kernel (acquire, system scope) only for the chunks it reads; then every
  peer is told its data was consumed.

Unlike ``ag_gemm_ce`` (chunked vendor GEMMs behind stream waits) a tile starts as soon as its own rows
have landed, and unlike ``push``/``pull`` no CTA is spent on copying. Flags: with the ``triton`` back end
they hold the channel's device epoch (the kernel waits for ``flag >= epoch``, its 1-program signal
kernels need an SM while the GEMM runs, so the grid leaves :data:`RESERVED_SMS` free); with ``memop``
they are tokens (``flag >= 1``), reset to 0 by stream memops after the kernel. Both replay in CUDA graphs.
The row chunks are uniform (``ceil(rows / chunks)`` rows, the last shorter) so a tile finds its chunks
by division. NVIDIA only (copy-engine copies through ``cuMemcpyAsync``); AMD runs ``push``/``pull``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import triton
import triton.language as tl

from . import signal as sig
from ._ag_fused import FusedConfig
from ._ag_fused_kernel import consume_tiles
from .ag_gemm_ce import MAX_CHUNKS, Channel, Plan
from .ag_gemm_ce import _raise as raise_flag  # the channel's transport, shared as is
from .ag_gemm_ce import _send as send_shard

#: SMs left free for the ``triton`` back end's 1-program wait/signal kernels on the side stream.
RESERVED_SMS = 2


@triton.jit
def _ce_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    inbox_ptr,
    flags_ptr,
    epoch_ptr,
    rank,
    M,
    N,
    K,
    Ms,
    Ks,
    rcw,
    flag_stride,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    num_consumers,
    WORLD_SIZE: tl.constexpr,
    GATHER_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    ALIGNED: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    B_ROW_MAJOR: tl.constexpr,
):
    epoch = tl.load(epoch_ptr, volatile=True)  # this call's flag value (written before the launch)
    consume_tiles(
        tl.program_id(0),
        num_consumers,
        epoch_ptr,  # the tile queue: unused, the schedule is static
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
        flag_stride,  # flags are [src, MAX_CHUNKS]: the row-chunk stride, one K chunk
        Ks,
        1,
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
    )


KERNEL = _ce_gemm_kernel


def uniform_chunks(rows: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """``(first row, row count)`` of ``ceil(rows / chunks)``-row chunks covering ``rows`` (last shorter)."""
    if rows < 1 or not 1 <= chunks <= min(rows, MAX_CHUNKS):
        raise ValueError(f"chunks: {chunks} does not fit {rows} rows (1..{min(rows, MAX_CHUNKS)})")
    width = -(-rows // chunks)
    return tuple((first, min(width, rows - first)) for first in range(0, rows, width))


def uniform_plan(plan: Plan, chunks: int) -> Plan:
    """``plan`` with uniform row chunks (the Triton consumer finds a row's chunk by division)."""
    if plan.gather_first or plan.fp32_accumulate:
        raise ValueError("plan: the Triton consumer reads peers' chunks in place (no gather_first/fp32)")
    return dataclasses.replace(plan, chunk_rows=uniform_chunks(plan.rows, chunks))


def launch_args(
    channel: Channel, plan: Plan, inbox: Any, a_shard: Any, b: Any, out: Any, epoch: Any, config: FusedConfig,
    num_sms: int,
) -> tuple[int, list[Any], dict[str, int]]:  # fmt: skip
    """Check shapes; ``(grid, the kernel's arguments in signature order, launch options)``."""
    ws, r = channel.world_size, channel.rank
    m, n = out.shape
    k = b.shape[0]
    ms, ks = plan.rows, plan.k_shard
    full = (ms * ws, ks) if plan.gather_dim == 0 else (ms, ks * ws)
    if tuple(a_shard.shape) != (ms, ks) or b.shape[1] != n or (m, k) != full:
        raise ValueError(
            f"shapes: shard {tuple(a_shard.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} do not match "
            f"the plan (rows {ms}, K shard {ks}, gather_dim={plan.gather_dim}, {ws} ranks)"
        )
    widths = {count for _, count in plan.chunk_rows[:-1]} | {plan.chunk_rows[0][1]}
    if len(widths) != 1 or plan.chunk_rows[0][0] != 0:
        raise ValueError("plan: chunks must be uniform (see uniform_plan)")
    reserve = RESERVED_SMS if channel.backend == "triton" else 0
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = min(num_sms - reserve, tiles)
    elem = a_shard.element_size()
    aligned = (ks * elem) % 16 == 0 and (a_shard.stride(0) * elem) % 16 == 0 and a_shard.data_ptr() % 16 == 0
    args = [
        a_shard, b, out, inbox, channel.data, epoch, r, m, n, k, ms, ks, plan.chunk_rows[0][1], MAX_CHUNKS,
        a_shard.stride(0), b.stride(0), b.stride(1), out.stride(0), out.stride(1), grid,
        ws, plan.gather_dim, config.block_m, config.block_n, config.block_k, config.group_m,
        ks % config.block_k == 0, n % config.block_n == 0, aligned, config.prefetch_k, b.stride(1) == 1,
    ]  # fmt: skip
    return grid, args, {"num_warps": config.num_warps, "num_stages": config.num_stages}


def ag_gemm_ce_gemm(
    channel: Channel, plan: Plan, inbox: Any, token: Any, a_shard: Any, b: Any, out: Any, config: FusedConfig,
    num_sms: int,
) -> Any:  # fmt: skip
    """``out = all_gather(a_shard) @ b``: copy-engine transport, one Triton GEMM; collective.

    ``plan`` from :func:`uniform_plan`; ``inbox`` the channel's arena viewed as A's dtype; ``token`` a
    1-element int32 device tensor holding 1 (the flag value of the ``memop`` back end). Launches only.
    """
    import torch

    ch = channel
    main = torch.cuda.current_stream()
    if ch.backend == "triton":
        sig.advance_epoch(ch.epoch)
    ch.fork.record(main)
    ch.side.wait_event(ch.fork)
    with torch.cuda.stream(ch.side):
        send_shard(ch, plan, a_shard)
    ch.join.record(ch.side)
    epoch = ch.epoch if ch.backend == "triton" else token
    grid, args, options = launch_args(ch, plan, inbox, a_shard, b, out, epoch, config, num_sms)
    _ce_gemm_kernel[(grid,)](*args, **options)
    if ch.backend == "memop":  # hand the tokens back: peers' next chunks may land
        base = ch.data.data_ptr()
        for p in plan.peers:
            for c in range(len(plan.chunk_rows)):
                sig.memop_write(base + 4 * (p * MAX_CHUNKS + c), 0, main)
    for _, done in plan.remote_done:  # this rank has consumed its inbox
        raise_flag(ch, done, main)
    main.wait_event(ch.join)
    return out
