"""Bounded waits on peers: every spin on a flag another rank raises gives up after a time bound, records
which wait failed in a small buffer the host reads without synchronising, and lets the kernel end.

A *watch slot* is 8 int64 words in pinned host memory (mapped into the device's address space; a plain
CPU tensor under Triton's interpreter), one per (op, variant, key) that a workspace serves:

* ``BOUND``: the wait bound in nanoseconds, written by the host (the kernels read it only after a wait has
  spun for :data:`CHECK_AFTER_NS`, so it costs nothing while flags arrive in time);
* ``GAVE_UP``: how many waits of this slot gave up (every giving-up program adds 1);
* ``PEER``, ``INDEX``, ``EXPECTED``, ``SEEN``: the first one's peer, flag index, the epoch it waited for and
  the value it last read; ``WRITTEN`` (1) once those four are written;
* ``ALARM``: the address of the process's alarm word, to which every giving-up program adds 1 (the host
  checks that one word on every dispatch).

Time is ``%globaltimer`` (ns) on NVIDIA, ``s_memrealtime`` (100 MHz) on AMD, the host's monotonic clock
under the interpreter, so the bound does not depend on clock speed. A program that gave up carries
``ok = 0`` and polls its later flags once instead of waiting again: a kernel whose peer is gone ends
within about one bound. The CTA gives up together (:func:`past_bound`): a decision each warp took from its
own clock reading hung the CTA at mismatched barriers. The result of such a call is wrong; the host raises
before it is used further.

:class:`WatchBoard` is the host side of the buffer (slots, alarm, records); naming what a slot serves and
raising the error is ``autotaxer.ops._peer_wait``'s job.
"""

from __future__ import annotations

import os
import time  # noqa: F401  (the interpreter's clock)
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

#: Words of one slot and their indices.
SLOT_WORDS = 8
BOUND, GAVE_UP, PEER, INDEX, EXPECTED, SEEN, WRITTEN, ALARM = range(SLOT_WORDS)
# the same indices as the kernels read them (globals of a kernel must be constexpr)
_BOUND, _GAVE_UP, _PEER, _INDEX = (
    tl.constexpr(BOUND),
    tl.constexpr(GAVE_UP),
    tl.constexpr(PEER),
    tl.constexpr(INDEX),
)
_EXPECTED, _SEEN, _WRITTEN, _ALARM = (
    tl.constexpr(EXPECTED),
    tl.constexpr(SEEN),
    tl.constexpr(WRITTEN),
    tl.constexpr(ALARM),
)

#: ``$AUTOTAXER_WAIT_CHECK_AFTER_US``: how long a wait spins before it reads its bound, in µs (10 000 unless
#: set; 50 until the 2026-11-29 A/B). Past it, :func:`spin_until` and :func:`spin_one` read the bound from
#: pinned host memory on every poll: a PCIe read per waiting warp and poll, and such reads from many warps
#: run one after another, so a wait past the threshold costs far more than itself. At 50 µs a rank that
#: started 50 µs behind its peer turned 40-60 µs calls into 0.3-7 ms ones, and the late call made the next
#: one late too: on 2xH200 (``bench/results/2026-11-29_wait_bound_ab_h200x2``, 88 entries of 22 keys, two
#: runs each) 15 entries took over twice their best time in a 50 µs run under graph replay and 39 in eager
#: timing, none at 10 ms; the others 1.003x (graph) in geomean. A wait on a dead peer gives up after the
#: larger of this and its bound. Read once at import (a constexpr: Triton's cache keys on it); records do
#: not carry it.
CHECK_AFTER_ENV = "AUTOTAXER_WAIT_CHECK_AFTER_US"


def check_after_ns() -> int:
    """``$AUTOTAXER_WAIT_CHECK_AFTER_US`` (a whole number of µs, at least 1) in ns, else 10 ms;
    ``ValueError`` naming the variable."""
    text = os.environ.get(CHECK_AFTER_ENV, "").strip()
    if not text:
        return 10_000_000
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{CHECK_AFTER_ENV}: expected a whole number of microseconds >= 1, got {text!r}")
    return int(text) * 1000


#: A wait reads its bound only after spinning this long (a host-memory read off the fast path).
CHECK_AFTER_NS = tl.constexpr(check_after_ns())

#: Larger than any flag index or value a kernel keeps (the neutral element of the minima below).
_NONE = tl.constexpr(2**31 - 1)


def _hip() -> bool:
    try:
        import torch

        return torch.version.hip is not None
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


if os.environ.get("TRITON_INTERPRET", "0") == "1":  # programs run on the host: its clock

    @triton.jit
    def now_ns():
        """Nanoseconds from a fixed point (the interpreter: the host's monotonic clock)."""
        return tl.full((), time.monotonic_ns(), tl.int64)

elif _hip():

    @triton.jit
    def now_ns():
        """Nanoseconds from a fixed point (AMD: the 100 MHz ``s_memrealtime`` counter)."""
        ticks = tl.inline_asm_elementwise(
            "s_waitcnt vmcnt(0)\n\ts_memrealtime $0\n\ts_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
            is_pure=False, pack=1,
        )  # fmt: skip
        return ticks * 10

else:

    @triton.jit
    def now_ns():
        """Nanoseconds from a fixed point (NVIDIA: ``%globaltimer``)."""
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )


@triton.jit
def give_up(watch_ptr, peer, index, expected, seen):
    """Record that a wait on ``peer``'s flag ``index`` (for ``expected``, last read ``seen``) gave up: the
    first of the slot writes the record, every one raises the process's alarm (system scope: the host
    reads both without synchronising)."""
    n = tl.atomic_add(watch_ptr + _GAVE_UP, 1, sem="relaxed", scope="sys")
    if n == 0:
        tl.store(watch_ptr + _PEER, tl.cast(peer, tl.int64))
        tl.store(watch_ptr + _INDEX, tl.cast(index, tl.int64))
        tl.store(watch_ptr + _EXPECTED, tl.cast(expected, tl.int64))
        tl.store(watch_ptr + _SEEN, tl.cast(seen, tl.int64))
        tl.atomic_xchg(watch_ptr + _WRITTEN, 1, sem="release", scope="sys")
    alarm = tl.load(watch_ptr + _ALARM).to(tl.pointer_type(tl.int64))
    tl.atomic_add(alarm, 1, sem="release", scope="sys")


#: Lanes of :func:`cta_uniform`'s reduction: at least the threads of the largest CTA (32 warps), so that no
#: warp holds a copy of another's lanes and the sum runs through every thread.
_CTA_LANES = tl.constexpr(1024)


@triton.jit
def cta_uniform(x):
    """``x`` (an ``int32`` scalar) as the thread holding lane 0 of a CTA-wide reduction has it, in every
    thread: a value each thread reads for itself made one value for the CTA.

    Triton treats a scalar as the same in every thread, but ``%globaltimer`` and a word of host memory are
    read by each warp at its own moment, so warps that straddle a clock tick (or a host write) disagree.
    A branch some warps take and others do not, with a CTA barrier inside or after it (the atomics of
    :func:`give_up`, the reduction of the next poll), deadlocks the CTA: on one H200 (2026-11-29) the
    ``push`` and ``push_tma`` kernels hung in about one call of three whose waits gave up, their giving-up
    record written. A reduction ends in shared memory that every thread reads, so its result is uniform."""
    lane = tl.arange(0, _CTA_LANES)
    return tl.sum(tl.where(lane == 0, x, 0), axis=0)


@triton.jit
def past_bound(waited, watch_ptr):
    """1 in every thread of the CTA when a wait that has spun ``waited`` ns must give up (past
    :data:`CHECK_AFTER_NS` and the slot's bound, read from the slot only then), else 0; the decision of
    one thread (:func:`cta_uniform`), so that the CTA gives up together."""
    over = tl.full((), 0, tl.int32)
    if waited > CHECK_AFTER_NS:  # each thread its own answer: nothing in here synchronises the CTA
        over = (waited > tl.load(watch_ptr + _BOUND, volatile=True)).to(tl.int32)
    return cta_uniform(over)


@triton.jit
def spin_until(ptrs, live, epoch, watch_ptr, peer, idx, ok):
    """Spin until every live flag of ``ptrs`` reaches ``epoch`` (acquire loads at system scope, side by side
    in the CTA's threads, so several flags cost one round trip), at most the slot's bound; returns ``ok``,
    0 once a wait of this program gave up (then later waits poll once and go on). ``idx`` are the flags'
    indices and ``peer`` the rank that raises them (a scalar, or one per flag): what the record names.

    The loop is the CTA's: Triton hands each atomic read's value to every thread through shared memory
    (the sm_90 PTX: one thread reads a flag, ``bar.sync``, every thread loads it), so every warp counts the
    same flags missing, and the give-up decision is one thread's (:func:`past_bound`). A read each warp
    makes for itself (``ce_persistent``'s ``ld.acquire`` polls) needs its count passed through
    :func:`cta_uniform` too.

    ``ok`` may be a literal (``1``): it is made an ``int32`` tensor first, since the loop below assigns it
    one and a compiled (not interpreted) kernel's variable keeps one type on every path."""
    ok = tl.cast(ok, tl.int32)
    seen = tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys")
    missing = live & (seen < epoch)
    pending = tl.sum(missing.to(tl.int32), axis=0)
    if (pending > 0) & (ok != 0):
        t0 = now_ns()
        while (pending > 0) & (ok != 0):
            seen = tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys")
            missing = live & (seen < epoch)
            pending = tl.sum(missing.to(tl.int32), axis=0)
            if pending > 0:
                if past_bound(now_ns() - t0, watch_ptr) != 0:
                    first = tl.min(tl.where(missing, idx, _NONE), axis=0)
                    low = tl.min(tl.where(missing, seen, _NONE), axis=0)
                    who = tl.min(tl.where(missing & (idx == first), peer, _NONE), axis=0)
                    give_up(watch_ptr, who, first, epoch, low)
                    ok = 0
    return ok


@triton.jit
def spin_one(flag_ptr, expected, watch_ptr, peer, index, ok, EQUAL: tl.constexpr = False):
    """Spin on one flag until it holds ``expected`` (``EQUAL``) or at least ``expected``, at most the slot's
    bound; returns ``ok`` as :func:`spin_until` does (which says why ``ok`` is cast first)."""
    ok = tl.cast(ok, tl.int32)
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    if EQUAL:
        pending = seen != expected
    else:
        pending = seen < expected
    if pending & (ok != 0):
        t0 = now_ns()
        while pending & (ok != 0):
            seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
            if EQUAL:
                pending = seen != expected
            else:
                pending = seen < expected
            if pending:
                if past_bound(now_ns() - t0, watch_ptr) != 0:
                    give_up(watch_ptr, peer, index, expected, seen)
                    ok = 0
    return ok


# -- host side ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GaveUp:
    """What a slot recorded: how many waits gave up, and the first one's peer, flag, epoch and last read
    (``None`` each when the record was not written yet)."""

    count: int
    peer: int | None
    index: int | None
    expected: int | None
    seen: int | None


class WatchBoard:
    """The slots of one device in one buffer, word 0 the alarm: pinned host memory on a GPU (the device
    writes it, the host reads it with no synchronisation), a CPU tensor under the interpreter."""

    def __init__(self, device: Any, slots: int = 1024) -> None:
        import torch

        self.device = torch.device(device)
        pinned = self.device.type == "cuda"
        self.words = torch.zeros(SLOT_WORDS * (slots + 1), dtype=torch.int64, pin_memory=pinned)
        self.view = self.words.numpy()  # host reads and writes without torch's dispatcher
        self.capacity = slots
        self._free = list(range(slots - 1, -1, -1))

    @property
    def alarm(self) -> int:
        """Waits of any slot that gave up so far (only grows)."""
        return int(self.view[0])

    def claim(self, bound_ns: int) -> int:
        """A cleared slot with ``bound_ns``; ``RuntimeError`` when all are in use."""
        if not self._free:
            raise RuntimeError(f"peer waits: all {self.capacity} watch slots are in use (workspaces alive)")
        i = self._free.pop()
        base = SLOT_WORDS * (i + 1)
        self.view[base : base + SLOT_WORDS] = 0
        self.view[base + BOUND] = bound_ns
        self.view[base + ALARM] = self.words.data_ptr()
        return i

    def release(self, i: int) -> None:
        """Slot ``i`` may serve another workspace."""
        self._free.append(i)

    def tensor(self, i: int) -> Any:
        """Slot ``i`` as the kernels take it (an int64 tensor of :data:`SLOT_WORDS`)."""
        base = SLOT_WORDS * (i + 1)
        return self.words[base : base + SLOT_WORDS]

    def set_bound(self, i: int, bound_ns: int) -> None:
        self.view[SLOT_WORDS * (i + 1) + BOUND] = bound_ns

    def read(self, i: int, settle_s: float = 1.0) -> GaveUp:
        """Slot ``i``'s record; waits up to ``settle_s`` for the first give-up's fields to be written."""
        base = SLOT_WORDS * (i + 1)
        v = self.view
        count = int(v[base + GAVE_UP])
        deadline = time.monotonic() + settle_s
        while count and not v[base + WRITTEN] and time.monotonic() < deadline:
            time.sleep(0.001)
        if not v[base + WRITTEN]:
            return GaveUp(count, None, None, None, None)
        return GaveUp(
            count, int(v[base + PEER]), int(v[base + INDEX]), int(v[base + EXPECTED]), int(v[base + SEEN])
        )

    def gave_up(self, i: int) -> int:
        return int(self.view[SLOT_WORDS * (i + 1) + GAVE_UP])


_BOARDS: dict[str, WatchBoard] = {}  # one per device: bounded


def board(device: Any) -> WatchBoard:
    """The process's :class:`WatchBoard` for ``device``."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = str(dev)
    if key not in _BOARDS:
        _BOARDS[key] = WatchBoard(dev)
    return _BOARDS[key]


#: The bound of a launch given no slot: ``$AUTOTAXER_PEER_TIMEOUT`` seconds, else this many.
DEFAULT_TIMEOUT_S = 5.0


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S) -> float:
    """``$AUTOTAXER_PEER_TIMEOUT`` (seconds, finite and > 0) or ``default``; ``ValueError`` naming it."""
    text = os.environ.get("AUTOTAXER_PEER_TIMEOUT")
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"AUTOTAXER_PEER_TIMEOUT: expected seconds, got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"AUTOTAXER_PEER_TIMEOUT: must be a finite number of seconds > 0, got {text!r}")
    return value


_UNNAMED: dict[str, Any] = {}


def unnamed_slot(device: Any) -> Any:
    """The slot of launches that were given none (tests and benchmarks calling a launcher directly)."""
    b = board(device)
    key = str(b.device)
    if key not in _UNNAMED:
        _UNNAMED[key] = b.tensor(b.claim(int(timeout_from_env() * 1e9)))
    return _UNNAMED[key]
