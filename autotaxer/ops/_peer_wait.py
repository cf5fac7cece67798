"""Peer waits that gave up, named on the host: which op, variant and key, which peer never signalled.

Every kernel that waits for a peer's flag takes a *watch slot* (``kernels/common/watch.py``): the wait gives
up after the slot's bound, records the peer and the flag, and raises the process's alarm word, which the
host reads without synchronising. :class:`PeerWatch` keeps what each slot serves (a :class:`Site`);
:meth:`PeerWatch.poll` turns new records into :class:`PeerTimeoutError`. ``dispatch`` polls on every call
(one comparison while nothing failed) and :func:`check` after a synchronisation.

A slot starts with a longer bound for the first call (``first_call_s``: ranks may still be compiling the
kernels, at different speeds) and gets its own once that call has finished (an event recorded at the next
poll).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Site:
    """What a watch slot serves: a variant of an op at a problem key, on one rank of a group."""

    op: str
    variant: str
    key: str
    rank: int
    world_size: int


@dataclass(frozen=True)
class PeerFailure:
    """A wait of ``site`` that gave up: the first one's peer, flag index, awaited epoch and last read value,
    and how many waits of the slot gave up."""

    site: Site
    bound_s: float
    count: int
    peer: int | None
    index: int | None
    expected: int | None
    seen: int | None

    def message(self) -> str:
        s = self.site
        who = f"rank {self.peer}" if self.peer is not None else "a peer"
        flag = (
            f" (flag {self.index}: waited for {self.expected}, read {self.seen})"
            if self.index is not None
            else ""
        )
        return (
            f"{s.op} {s.variant} at {s.key}: rank {s.rank} of {s.world_size} waited {self.bound_s:g} s for "
            f"{who}, which never signalled{flag}; {self.count} wait(s) gave up. That result is wrong and "
            "dispatch no longer serves this variant for this key in this process (raise the bound with "
            "RuntimeConfig(peer_timeout_s=...) or AUTOTAXER_PEER_TIMEOUT if the peer was only late)"
        )


class PeerTimeoutError(RuntimeError):
    """A kernel's wait on a peer gave up after its time bound; ``failure`` says where (op, variant, key,
    peer, flag)."""

    def __init__(self, failure: PeerFailure, more: int = 0) -> None:
        text = failure.message()
        if more:
            text += f" ({more} other site(s) gave up too)"
        super().__init__(text)
        self.failure = failure


class WatchSlot:
    """One claimed slot: ``tensor`` is what the kernels take; released when this object is collected."""

    __slots__ = ("tensor", "index", "__weakref__")

    def __init__(self, watch: PeerWatch, index: int) -> None:
        self.tensor = watch.board.tensor(index)
        self.index = index
        weakref.finalize(self, watch.close, index)


class PeerWatch:
    """The sites of one device's watch board, and the failures reported so far."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.view = board.view  # word 0: the alarm (read on dispatch's hot path)
        self.seen_alarm = board.alarm  # the alarm's value at the last poll
        #: the alarm value the hot path expects: ``seen_alarm``, or -1 while a slot waits for its own bound
        self.expect = self.seen_alarm
        self.sites: dict[int, tuple[Site, int]] = {}  # slot -> (site, bound in ns)
        self.reported: dict[int, int] = {}  # slot -> give-ups already reported
        #: (op, variant, key) that gave up in this process: dispatch no longer serves them
        self.failed: set[tuple[str, str, str]] = set()
        self._settling: list[list[Any]] = []  # [slot, bound_ns, event or None]

    def open(self, site: Site, bound_s: float, first_call_s: float | None = None) -> WatchSlot:
        """A slot for ``site`` with the bound ``bound_s`` (``first_call_s``, when longer, until its first call
        has finished)."""
        bound_ns = int(bound_s * 1e9)
        first_ns = int(max(bound_s, first_call_s or 0.0) * 1e9)
        index = self.board.claim(first_ns)
        self.sites[index] = (site, bound_ns)
        self.reported[index] = 0
        if first_ns != bound_ns:
            self._settling.append([index, bound_ns, None])
            self.expect = -1
        return WatchSlot(self, index)

    def close(self, index: int) -> None:
        self.sites.pop(index, None)
        self.reported.pop(index, None)
        self._settling = [s for s in self._settling if s[0] != index]
        self.board.release(index)

    def poll(self) -> None:
        """Raise :class:`PeerTimeoutError` for waits that gave up since the last poll (the first site's,
        naming how many others); give settled slots their own bound."""
        if self._settling:
            self._settle()
        alarm = self.board.alarm
        failures = []
        if alarm != self.seen_alarm:
            self.seen_alarm = alarm
            for index, (site, bound_ns) in list(self.sites.items()):
                count = self.board.gave_up(index)
                if count > self.reported[index]:
                    r = self.board.read(index)
                    self.reported[index] = count
                    failures.append(
                        PeerFailure(site, bound_ns / 1e9, r.count, r.peer, r.index, r.expected, r.seen)
                    )
                    self.failed.add((site.op, site.variant, site.key))
        self.expect = -1 if self._settling else self.seen_alarm
        if failures:
            raise PeerTimeoutError(failures[0], more=len(failures) - 1)

    def _settle(self) -> None:
        import torch

        cuda = self.board.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            return  # no event may be recorded or queried under capture: after it
        still = []
        for entry in self._settling:
            index, bound_ns, event = entry
            if not cuda:
                self.board.set_bound(index, bound_ns)
            elif event is None:  # recorded after the first call, in stream order
                entry[2] = torch.cuda.Event()
                entry[2].record(torch.cuda.current_stream(self.board.device))
                still.append(entry)
            elif event.query():
                self.board.set_bound(index, bound_ns)
            else:
                still.append(entry)
        self._settling = still

    def is_failed(self, op: str, variant: str, key: str) -> bool:
        return (op, variant, key) in self.failed


_WATCHES: dict[str, PeerWatch] = {}  # one per device: bounded


def peer_watch(device: Any) -> PeerWatch:
    """The process's :class:`PeerWatch` for ``device``."""
    from autotaxer.kernels.common.watch import board

    b = board(device)
    key = str(b.device)
    if key not in _WATCHES:
        _WATCHES[key] = PeerWatch(b)
    return _WATCHES[key]


class _Idle:
    """What a runtime polls before it has a device: nothing ever fails."""

    def __init__(self) -> None:
        import numpy as np

        self.view = np.zeros(1, dtype=np.int64)
        self.expect = 0
        self.failed: set[tuple[str, str, str]] = set()

    def poll(self) -> None:
        return None

    def is_failed(self, op: str, variant: str, key: str) -> bool:
        return False


IDLE = _Idle()


def check(device: Any = None) -> None:
    """Synchronise ``device`` (default: the current CUDA device, if any) and raise :class:`PeerTimeoutError`
    if a kernel's wait on a peer gave up since the last check or dispatch. Local: no collective.

    ``"cuda"`` without an index is the current CUDA device, as for the watch boards (``torch.device("cuda")``
    does not compare equal to ``torch.device("cuda", 0)``: unnormalised, no board's records were read)."""
    import torch

    if device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for watch in list(_WATCHES.values()):
        if device is None or watch.board.device == device or watch.board.device.type == "cpu":
            watch.poll()
