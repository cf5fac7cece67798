"""The copy engines' channel between ranks, shared by every copy-engine schedule of every op: per Iris heap
and signalling back end, an inbox arena, the data and done flags, the device-resident epoch and the
side stream, and how flags are raised and awaited.

Flags are raised and awaited either by :mod:`.signal`'s 1-program Triton kernels against a
device-resident epoch (portable) or by CUDA stream memory operations (NVIDIA, token protocol). Both
are CUDA-graph replay safe: nothing the host decides differs from call to call.

Inboxes are single-buffered: the "consumed" flag (``done``) is what stops a peer that is one call ahead
from overwriting data still being read. One channel exists per Iris heap and signalling back end; Iris
never frees heap memory, so the arena grows and is reused. The schedules (``ag_gemm``'s
``copy_engine``, ``ce_fanout``, ``ce_grouped``; ``gemm_rs``'s ``copy_engine``) keep one protocol, so
calls of every schedule may follow one another on one channel.

History: moved unchanged out of ``kernels/ag_gemm/copy_engine.py`` (issue 38), so that ``gemm_rs``
imports nothing of ``ag_gemm``; the private names ``_raise`` and ``_await`` kept, so the copy-engine
variants' records stay current (the restamp tool compares the moved code).
"""

from __future__ import annotations

from typing import Any

import torch

from . import signal as sig
from .lanes import lane_streams

#: Most chunks per peer shard (flag slots per source rank).
MAX_CHUNKS = 16
BACKENDS = ("triton", "memop")


class Channel:
    """Per-heap, per-back-end state shared by every copy-engine workspace (collective to create)."""

    def __init__(self, iris_ctx: Any, backend: str, rank: int, world_size: int, group: Any) -> None:
        import torch.distributed as dist

        if backend not in BACKENDS:
            raise ValueError(f"signal: unknown back end {backend!r} (expected one of {', '.join(BACKENDS)})")
        self.iris = iris_ctx
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        self.group = group
        # data[src, chunk]: set by src when its chunk has landed here. done[src]: set by src when it has
        # consumed everything this rank sent it in the last call (its inbox may be overwritten).
        self.data = iris_ctx.zeros(world_size * MAX_CHUNKS, dtype=torch.int32)
        self.done = iris_ctx.zeros(world_size, dtype=torch.int32)
        if backend == "memop":
            self.done.fill_(1)  # token protocol: the peer's inbox starts free
        self.epoch = torch.zeros(1, dtype=torch.int32, device=self.data.device)
        self.side = torch.cuda.Stream(device=self.data.device)
        self.fork = torch.cuda.Event()
        self.join = torch.cuda.Event()
        #: the watch slot bounding the waits of the call under way (set by each launcher as it starts)
        self.watch: Any = None
        self._arena: Any = None
        torch.cuda.synchronize()
        dist.barrier(group=group)

    def arena(self, nbytes: int) -> Any:
        """A heap byte buffer of at least ``nbytes`` (collective when it has to grow)."""
        import torch.distributed as dist

        if self._arena is None or self._arena.numel() < nbytes:
            size = max(nbytes, 1 << 20)
            size = 1 << (size - 1).bit_length()  # powers of two bound what the growth leaks
            self._arena = self.iris.zeros(size, dtype=torch.uint8)
            torch.cuda.synchronize()
            dist.barrier(group=self.group)
        return self._arena

    def remote(self, ptr: int, peer: int) -> int:
        """``ptr`` (in this rank's heap) translated to ``peer``'s copy, as mapped in this process."""
        return int(self.iris.heap.translate(int(ptr), self.rank, peer))


_CHANNELS: dict[tuple[int, str], Channel] = {}  # bounded: one per (heap, back end)


def get_channel(iris_ctx: Any, backend: str, rank: int, world_size: int, group: Any) -> Channel:
    """The channel of ``iris_ctx`` for ``backend``, created (collectively) on first use."""
    key = (id(iris_ctx), backend)
    if key not in _CHANNELS:
        _CHANNELS[key] = Channel(iris_ctx, backend, rank, world_size, group)
    return _CHANNELS[key]


def peer_order(rank: int, world_size: int, order: str) -> tuple[int, ...]:
    """Peers in consumption order: ``rotated`` (r+1, r+2, ...) or ``reverse`` (r-1, r-2, ...)."""
    steps = range(1, world_size)
    if order == "rotated":
        return tuple((rank + s) % world_size for s in steps)
    if order == "reverse":
        return tuple((rank - s) % world_size for s in steps)
    raise ValueError(f"order: expected 'rotated' or 'reverse', got {order!r}")


# -- signalling, per back end ------------------------------------------------------------------------


def _raise(ch: Channel, addr: int, stream: Any) -> None:
    if ch.backend == "memop":
        sig.memop_write(addr, 1, stream)
    else:
        sig.signal(sig.Int32Ptr(addr), ch.epoch)


def _await(ch: Channel, flag: Any, stream: Any, offset: int = 0) -> None:
    """Wait on a local flag element (``data[src, chunk]`` or ``done[src]``), bounded by the watch slot of
    the call under way (``ch.watch``); the memop back end hands the token back (writes 0)."""
    at = (flag.data_ptr() - ch.data.data_ptr()) // 4
    if 0 <= at < ch.data.numel():
        peer, index = divmod(at, MAX_CHUNKS)
    else:  # done[peer]: this rank's data in the peer's inbox was consumed
        peer, index = (flag.data_ptr() - ch.done.data_ptr()) // 4, -1
    if ch.backend == "memop":
        sig.memop_wait_eq(flag.data_ptr(), 1, stream, ch.watch, peer, index)
        sig.memop_write(flag.data_ptr(), 0, stream)
    else:
        sig.wait(flag, ch.epoch, offset=offset, watch=ch.watch, peer=peer, index=index)


def fork_lanes(ch: Channel, peer_lanes: tuple[tuple[int, ...], ...], watch: Any, send: Any,
               *args: Any) -> tuple:  # fmt: skip
    """Start a call on ``ch``: its waits bounded by the watch slot ``watch``, the epoch advanced (triton
    back end), and one side stream per lane of ``peer_lanes`` (:func:`.lanes.lane_streams`: the channel's
    own first) forked from the caller's stream, on which ``send(*args, peers, stream)`` issues that lane's
    copies and flags. Returns ``(main, lanes)``: the caller's stream and the lanes' (stream, join event)."""
    ch.watch = watch
    main = torch.cuda.current_stream()
    if ch.backend == "triton":
        sig.advance_epoch(ch.epoch)
    ch.fork.record(main)
    lanes = lane_streams(ch, len(peer_lanes))
    for (stream, join), peers in zip(lanes, peer_lanes, strict=True):
        stream.wait_event(ch.fork)
        with torch.cuda.stream(stream):
            send(*args, peers, stream)
        join.record(stream)
    return main, lanes


def join_lanes(ch: Channel, remote_done: tuple[tuple[int, int], ...], main: Any, lanes: Any) -> None:
    """End a call: tell each peer of ``remote_done`` (peer, address of its ``done`` flag for this rank)
    that this rank has consumed what it sent (it may overwrite its slot here), then join every lane into
    the caller's stream ``main``."""
    for _, done in remote_done:
        _raise(ch, done, main)
    for _, join in lanes:
        main.wait_event(join)
