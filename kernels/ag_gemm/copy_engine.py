"""Copy-engine all-gather + GEMM: peer copies on a side stream, vendor GEMMs on the caller's stream.

Schedule of one call on rank ``r`` (0 SMs for communication):

* side stream (forked from the caller's stream by an event, so the input is ready): for every peer
  ``p`` (rank-rotated order) wait until ``p`` has finished reading its inbox from the previous call,
  then for every chunk of rows copy ``A_r``'s chunk into ``p``'s inbox with the copy engine
  (``cuMemcpyAsync`` over NVLink) and raise ``p``'s flag for ``(r, chunk)``;
* caller's stream: the GEMM of the local shard first, then for each peer and chunk wait for its flag
  and run that chunk's GEMM (``gather_dim=0``: its rows of ``C``; ``gather_dim=1``: ``C[rows] +=
  A_p[rows] @ B[p's K rows]``); ``gather_first`` instead waits for every chunk and runs one GEMM, which
  wins at small M where each GEMM is bound by reading all of ``B``; finally tell every peer that its
  data in this rank's inbox has been consumed, and join the side stream.

The channel (inbox arena, flags, epoch, side stream) and how flags are raised and awaited are
:mod:`..common.channel`'s, shared with every copy-engine schedule of both ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..common import signal as sig
from ..common.channel import MAX_CHUNKS, Channel, _await, _raise, join_lanes, peer_order
from ..common.channel import get_channel as get_channel  # the variants' import (their records' code)


@dataclass(frozen=True)
class Plan:
    """Everything a call needs, resolved at prepare time (addresses, row ranges, order)."""

    gather_dim: int
    rows: int  # rows of one shard (and of its chunks' union)
    k_shard: int  # K columns of one shard
    elem: int  # bytes per element
    chunk_rows: tuple[tuple[int, int], ...]  # (first row, row count) per chunk
    peers: tuple[int, ...]  # in consumption order
    gather_first: bool
    fp32_accumulate: bool
    inbox_ptr: int  # this rank's inbox (W slots, slot p = A_p)
    remote_inbox: tuple[tuple[int, int], ...]  # (peer, address of this rank's slot in peer's inbox)
    remote_data: tuple[tuple[int, int], ...]  # (peer, address of peer's data[rank, 0])
    remote_done: tuple[tuple[int, int], ...]  # (peer, address of peer's done[rank])

    @property
    def shard_bytes(self) -> int:
        return self.rows * self.k_shard * self.elem

    @property
    def lanes(self) -> tuple[tuple[int, ...], ...]:
        """One lane, the channel's side stream: every peer's copies one after another."""
        return (self.peers,)


def split_rows(rows: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """``chunks`` nearly equal, non-empty row ranges covering ``rows``."""
    if chunks < 1 or chunks > rows:
        raise ValueError(f"chunks: {chunks} does not fit {rows} rows (1..{rows})")
    base, extra = divmod(rows, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (1 if c < extra else 0)
        out.append((start, n))
        start += n
    return tuple(out)


def make_plan(
    channel: Channel,
    *,
    m: int,
    k: int,
    gather_dim: int,
    elem: int,
    chunks: int,
    order: str,
    gather_first: bool,
    fp32_accumulate: bool,
) -> Plan:
    """Resolve a call's addresses and ranges (collective: may grow the channel's arena)."""
    ws, r = channel.world_size, channel.rank
    rows, k_shard = (m // ws, k) if gather_dim == 0 else (m, k // ws)
    shard_bytes = rows * k_shard * elem
    inbox = channel.arena(ws * shard_bytes).data_ptr()
    peers = peer_order(r, ws, order)
    data0 = channel.data.data_ptr() + r * MAX_CHUNKS * 4
    done = channel.done.data_ptr() + r * 4
    return Plan(
        gather_dim=gather_dim,
        rows=rows,
        k_shard=k_shard,
        elem=elem,
        chunk_rows=split_rows(rows, chunks),
        peers=peers,
        gather_first=gather_first,
        fp32_accumulate=fp32_accumulate,
        inbox_ptr=inbox,
        remote_inbox=tuple((p, channel.remote(inbox + r * shard_bytes, p)) for p in peers),
        remote_data=tuple((p, channel.remote(data0, p)) for p in peers),
        remote_done=tuple((p, channel.remote(done, p)) for p in peers),
    )


def _send(ch: Channel, plan: Plan, a_shard: Any) -> None:
    """Side stream: copy this rank's shard, chunk by chunk, into every peer's inbox and flag it."""
    row_bytes = plan.k_shard * plan.elem
    src = a_shard.data_ptr()
    side = ch.side
    for (p, dst), (_, data) in zip(plan.remote_inbox, plan.remote_data, strict=True):
        # The peer must have consumed what this rank sent it in the previous call.
        _await(ch, ch.done[p : p + 1], side, offset=-1)
        for c, (first, n) in enumerate(plan.chunk_rows):
            off = first * row_bytes
            sig.memcpy_async(dst + off, src + off, n * row_bytes, side)
            _raise(ch, data + 4 * c, side)
    if plan.gather_first:
        own = plan.inbox_ptr + ch.rank * plan.shard_bytes
        sig.memcpy_async(own, src, plan.shard_bytes, side)


def _inbox_view(plan: Plan, inbox: Any, p: int) -> Any:
    """Peer ``p``'s shard in this rank's inbox, as a ``(rows, k_shard)`` tensor."""
    n = plan.rows * plan.k_shard
    return inbox[p * n : (p + 1) * n].view(plan.rows, plan.k_shard)


def gemm_peer_rows(ch: Channel, plan: Plan, inbox: Any, b: Any, out: Any, flags: Any, main: Any) -> None:
    """``gather_dim=0``: each peer's rows of ``out``, chunk by chunk as its flags come up (one GEMM each)."""
    rows = plan.rows
    for p in plan.peers:
        a_p = _inbox_view(plan, inbox, p)
        for c, (first, n) in enumerate(plan.chunk_rows):
            _await(ch, flags[p, c : c + 1], main)
            lo = p * rows + first
            torch.matmul(a_p[first : first + n], b, out=out[lo : lo + n])


def gemm_k_slices(ch: Channel, plan: Plan, inbox: Any, a_shard: Any, b: Any, out: Any, acc: Any, flags: Any,
                  main: Any) -> None:  # fmt: skip
    """``gather_dim=1``: the local K-slice's product, then each peer's added chunk by chunk as its flags come
    up (``plan.fp32_accumulate``: into the fp32 ``acc``, converted into ``out`` at the end)."""
    r, ks = ch.rank, plan.k_shard
    target = acc if plan.fp32_accumulate else out
    if plan.fp32_accumulate:
        torch.mm(a_shard, b[r * ks : (r + 1) * ks], out_dtype=torch.float32, out=target)
    else:
        torch.matmul(a_shard, b[r * ks : (r + 1) * ks], out=target)
    for p in plan.peers:
        a_p = _inbox_view(plan, inbox, p)
        b_p = b[p * ks : (p + 1) * ks]
        for c, (first, n) in enumerate(plan.chunk_rows):
            _await(ch, flags[p, c : c + 1], main)
            t = target[first : first + n]
            if plan.fp32_accumulate:
                torch.addmm(t, a_p[first : first + n], b_p, out_dtype=torch.float32, out=t)
            else:
                t.addmm_(a_p[first : first + n], b_p)
    if plan.fp32_accumulate:
        out.copy_(acc)


def hand_out(plan: Plan, inbox: Any, a_shard: Any, gathered: Any, rank: int, world_size: int) -> None:
    """Copy the gathered A of the call under way into ``gathered`` (``(M, K)``, contiguous): the peers'
    shards from this rank's inbox, the local one from ``a_shard`` (``gather_first``: the inbox holds all).
    On the caller's stream, after every flag was awaited and before the peers are told the inbox is free."""
    n = plan.rows * plan.k_shard
    slots = inbox[: world_size * n].view(world_size, plan.rows, plan.k_shard)
    if plan.gather_dim == 0:
        dst = gathered.view(world_size, plan.rows, plan.k_shard)
    else:
        dst = gathered.view(plan.rows, world_size, plan.k_shard).transpose(0, 1)
    if plan.gather_first:
        dst.copy_(slots)
        return
    dst[rank].copy_(a_shard)
    if rank > 0:
        dst[:rank].copy_(slots[:rank])
    if rank < world_size - 1:
        dst[rank + 1 :].copy_(slots[rank + 1 :])


def ag_gemm_ce(channel: Channel, plan: Plan, inbox: Any, a_shard: Any, b: Any, out: Any, acc: Any = None,
               watch: Any = None, gathered: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` with the copy-engine schedule; collective.

    ``inbox`` is the arena viewed as ``a_shard``'s dtype; ``acc`` an fp32 ``out``-shaped workspace when
    ``plan.fp32_accumulate``; ``watch`` the watch slot bounding the flag waits (``kernels/common/watch.py``;
    None: the process's slot for unnamed launches); ``gathered``: an ``(M, K)`` tensor that also receives
    the gathered A (:func:`hand_out`; None: the schedule as it always was). Launches only: no host
    synchronisation, no allocation.
    """
    ch, r = channel, channel.rank
    # fork_lanes' steps for its one lane, written out: this is every call's host path
    ch.watch = watch
    main = torch.cuda.current_stream()
    if ch.backend == "triton":
        sig.advance_epoch(ch.epoch)
    ch.fork.record(main)
    ch.side.wait_event(ch.fork)
    with torch.cuda.stream(ch.side):
        _send(ch, plan, a_shard)
    ch.join.record(ch.side)
    rows, ks = plan.rows, plan.k_shard
    flags = ch.data.view(ch.world_size, MAX_CHUNKS)
    if plan.gather_dim == 0 and plan.gather_first:
        for p in plan.peers:
            for c in range(len(plan.chunk_rows)):
                _await(ch, flags[p, c : c + 1], main)
        main.wait_event(ch.join)  # the local shard's copy into the inbox
        torch.matmul(inbox[: ch.world_size * rows * ks].view(-1, ks), b, out=out)
    elif plan.gather_dim == 0:
        torch.matmul(a_shard, b, out=out[r * rows : (r + 1) * rows])
        gemm_peer_rows(ch, plan, inbox, b, out, flags, main)
    else:
        gemm_k_slices(ch, plan, inbox, a_shard, b, out, acc, flags, main)
    if gathered is not None:
        hand_out(plan, inbox, a_shard, gathered, r, ch.world_size)
    join_lanes(ch, plan.remote_done, main, ((ch.side, ch.join),))  # this rank consumed its inbox
    return out
