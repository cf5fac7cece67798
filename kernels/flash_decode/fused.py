"""Fused distributed flash decode: one launch computes, pushes and combines, with no global barrier.

Every program first takes a ticket from a device counter (``atomic_add``). Tickets give the program
its role and this call's epoch: ``epoch = ticket // grid + 1``, ``role = ticket % grid``. Roles
``< num_producers`` are producers, one per (row, KV head, split): they compute the partial of this
rank's KV shard (``flash_decode.partial_attention``), ``iris.store`` it into the inbox of every rank
(their own first), then - after a CTA barrier, so all threads' stores precede it - raise one flag per
rank with a release ``atomic_xchg`` at system scope. The other roles are consumers, one per (row, KV
head): they spin with acquire loads until the ``world_size * splits`` flags of their group carry this
epoch, then merge the partials from the local inbox (``flash_decode.combine_head``) into ``out``.

Why tickets and not program ids: a consumer exists only once every producer ticket of the call has
been handed to a running program, so spinning consumers can never occupy the SMs a local producer
still needs, for any grid size (remote producers are guaranteed the same way on their GPU).

Why no reset: the ticket counter and the flags only grow; the epoch lives in device memory and
advances on the device, so CUDA-graph replays see fresh epochs. Inbox and flags have two parity slots
(``epoch % 2``): a rank can start call ``e + 1`` while a peer still reads call ``e`` (its slot is the
other one), but not call ``e + 2``, which needs the peer's call-``e + 1`` partials, pushed only after
the peer's call ``e`` has finished. All ranks must launch the same grid the same number of times.

Under the Triton interpreter programs run one after another, so a test launches the producers of
every rank first and then the consumers (``phase``): the kernel is the same, only the grid is split.
"""

from __future__ import annotations

from typing import Any

import iris
import triton
import triton.language as tl

from ..common.watch import spin_until, unnamed_slot
from .partials import (
    MAX_PARTIALS,
    DecodeConfig,
    block_p,
    check_decode_inputs,
    combine_head,
    kv_args,
    partial_attention,
)

PHASES = ("all", "produce", "consume")


@triton.jit
def _produce(kv, inbox_o_ptr, inbox_lse_ptr, flags_ptr, heap_bases, role, epoch, slot, rank, batch,
             num_kv_heads, splits, strides, qk_scale, WORLD_SIZE: tl.constexpr,
             META: tl.constexpr):  # fmt: skip
    GROUP: tl.constexpr = META.GROUP
    BLOCK_G: tl.constexpr = META.BLOCK_G
    HEAD_DIM: tl.constexpr = META.HEAD_DIM
    b, kvh, split, o, lse = partial_attention(kv, role, num_kv_heads, splits, strides, qk_scale, META)
    num_partials = WORLD_SIZE * splits
    p = rank * splits + split
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    # inbox layout (2, B, H, P, D) / (2, B, H, P); row = (slot * B + b) * H + h
    row = ((slot * batch + b) * num_kv_heads * GROUP + kvh * GROUP + offs_g).to(tl.int64)
    lse_dst = inbox_lse_ptr + row * num_partials + p
    o_dst = inbox_o_ptr + (row * num_partials + p)[:, None] * HEAD_DIM + offs_d[None, :]
    for i in tl.static_range(WORLD_SIZE):
        dest = (rank + i) % WORLD_SIZE
        iris.store(o_dst, o, rank, dest, heap_bases, mask=g_ok[:, None])
        iris.store(lse_dst, lse, rank, dest, heap_bases, mask=g_ok)
    tl.debug_barrier()  # every thread's stores are issued before the one-thread releases below
    flag = flags_ptr + ((slot * batch + b) * num_kv_heads + kvh).to(tl.int64) * num_partials + p
    for i in tl.static_range(WORLD_SIZE):
        dest = (rank + i) % WORLD_SIZE
        iris.atomic_xchg(flag, epoch, rank, dest, heap_bases, sem="release", scope="sys")


@triton.jit
def _consume(
    out_ptr,
    inbox_o_ptr,
    inbox_lse_ptr,
    flags_ptr,
    watch_ptr,
    role,
    epoch,
    slot,
    batch,
    num_kv_heads,
    splits,
    stride_out_b,
    stride_out_h,
    WORLD_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    b = role // num_kv_heads
    kvh = role % num_kv_heads
    num_partials = WORLD_SIZE * splits
    offs_f = tl.arange(0, BLOCK_F)
    f_ok = offs_f < num_partials
    first = ((slot * batch + b) * num_kv_heads + kvh).to(tl.int64) * num_partials
    # Acquire loads (atomic add of 0): a plain volatile load would not order the inbox reads after it.
    # Bounded by the watch slot: partial f comes from rank f // splits.
    spin_until(flags_ptr + first + offs_f, f_ok, epoch, watch_ptr, offs_f // splits, first + offs_f, 1)
    tl.debug_barrier()  # the acquiring threads' observation precedes every thread's inbox reads
    offs_d = tl.arange(0, HEAD_DIM)
    for g in range(GROUP):
        h = kvh * GROUP + g
        row = ((slot * batch + b) * num_kv_heads * GROUP + h).to(tl.int64) * num_partials
        res = combine_head(
            inbox_o_ptr + row * HEAD_DIM, inbox_lse_ptr + row, num_partials, splits, splits * HEAD_DIM,
            HEAD_DIM, splits, 1, HEAD_DIM, BLOCK_P,
        )  # fmt: skip
        out = out_ptr + b.to(tl.int64) * stride_out_b + h.to(tl.int64) * stride_out_h + offs_d
        tl.store(out, res.to(out_ptr.dtype.element_ty))


@triton.jit
def _flash_decode_fused_kernel(
    kv,
    out_ptr,
    inbox_o_ptr,
    inbox_lse_ptr,
    flags_ptr,
    ticket_ptr,
    heap_bases,
    watch_ptr,
    rank,
    batch,
    num_kv_heads,
    splits,
    num_producers,
    grid_size,
    strides,
    stride_out_b,
    stride_out_h,
    qk_scale,
    WORLD_SIZE: tl.constexpr,
    META: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    ticket = tl.atomic_add(ticket_ptr, 1)  # int64: never wraps in practice
    epoch = ticket // grid_size + 1
    role = ticket % grid_size
    slot = epoch % 2
    if role < num_producers:
        _produce(
            kv, inbox_o_ptr, inbox_lse_ptr, flags_ptr, heap_bases, role, epoch, slot, rank, batch,
            num_kv_heads, splits, strides, qk_scale, WORLD_SIZE, META,
        )  # fmt: skip
    else:
        _consume(
            out_ptr, inbox_o_ptr, inbox_lse_ptr, flags_ptr, watch_ptr, role - num_producers, epoch, slot,
            batch, num_kv_heads, splits, stride_out_b, stride_out_h, WORLD_SIZE, META.GROUP, META.HEAD_DIM,
            BLOCK_P, BLOCK_F,
        )  # fmt: skip


def inbox_shapes(batch: int, heads: int, head_dim: int, world_size: int, splits: int):
    """Shapes of the fp32 inbox buffers ``(O, LSE)``: two parity slots of ``world_size * splits`` partials."""
    p = world_size * splits
    return (2, batch, heads, p, head_dim), (2, batch, heads, p)


def flag_shape(batch: int, kv_heads: int, world_size: int, splits: int) -> tuple[int, ...]:
    """Shape of the int64 flags: one per (parity slot, row, KV head, source partial)."""
    return (2, batch, kv_heads, world_size * splits)


def flash_decode_fused(
    q,
    k,
    v,
    lengths,
    out,
    *,
    inbox_o,
    inbox_lse,
    flags,
    ticket,
    heap_bases,
    rank: int,
    world_size: int,
    config: DecodeConfig,
    phase: str = "all",
    watch: Any = None,
) -> None:
    """Launch the fused decode: ``out (B, H, D)`` gets attention over every rank's KV shard.

    ``inbox_o``, ``inbox_lse`` and ``flags`` live on the symmetric heap (same offsets on every rank),
    zeroed once before the first call (flags) and never reset; ``ticket`` is a local int64 counter,
    zeroed once. ``phase`` other than ``"all"`` is for the interpreter only (see the module docstring).
    ``watch``: the watch slot bounding the consumers' waits on peers (``kernels/common/watch.py``; None:
    the process's slot for unnamed launches).
    """
    import torch

    b, h, hkv, d, _ = check_decode_inputs(q, k, v, lengths)
    s = config.splits
    p = world_size * s
    if p > MAX_PARTIALS:
        raise ValueError(f"splits: world_size * splits = {p} exceeds {MAX_PARTIALS}")
    if phase not in PHASES:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    if tuple(inbox_o.shape) != (2, b, h, p, d) or inbox_o.dtype != torch.float32:
        raise ValueError(
            f"inbox_o: expected fp32 {(2, b, h, p, d)}, got {inbox_o.dtype} {tuple(inbox_o.shape)}"
        )
    if tuple(inbox_lse.shape) != (2, b, h, p) or inbox_lse.dtype != torch.float32:
        raise ValueError(f"inbox_lse: expected fp32 {(2, b, h, p)}, got {tuple(inbox_lse.shape)}")
    if tuple(flags.shape) != flag_shape(b, hkv, world_size, s) or flags.dtype != torch.int64:
        raise ValueError(
            f"flags: expected int64 {flag_shape(b, hkv, world_size, s)}, got {tuple(flags.shape)}"
        )
    if ticket.dtype != torch.int64 or ticket.numel() != 1:
        raise ValueError("ticket: expected one int64 element")
    if tuple(out.shape) != (b, h, d) or out.stride(2) != 1:
        raise ValueError(f"out: expected shape {(b, h, d)} with unit stride along D, got {tuple(out.shape)}")
    producers = b * hkv * s
    consumers = b * hkv
    grid = {"all": producers + consumers, "produce": producers, "consume": consumers}[phase]
    if watch is None:
        watch = unnamed_slot(ticket.device)
    kv, strides, qk_scale, meta = kv_args(q, k, v, lengths, config)
    _flash_decode_fused_kernel[(grid,)](
        kv, out, inbox_o, inbox_lse, flags, ticket, heap_bases, watch, rank, b, hkv, s, producers,
        producers + consumers, strides, out.stride(0), out.stride(1), qk_scale, WORLD_SIZE=world_size,
        META=meta, BLOCK_P=block_p(p), BLOCK_F=triton.next_power_of_2(p), num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
