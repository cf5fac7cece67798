"""Copy-engine all-gather + one persistent Triton GEMM whose tiles wait on per-chunk arrival flags.

Issue 47: at four and eight ranks the chunked vendor GEMMs of :mod:`..copy_engine` / :mod:`.ce_fanout`
(one cuBLAS call per peer chunk, each a quarter or an eighth of M with its own launch and tail) and the
SM-driven pushes (producers take SMs from the GEMM) stay near BSP. Here no SM moves data and one GEMM
launch covers every tile. On rank ``r``:

* side streams (*lanes*, forked from the caller's stream after the device-resident epoch advanced): for
  each peer ``p`` in the order ``r-1, r-2, ...`` wait until ``p`` has consumed the previous call's data
  (the channel's ``done`` flag), then copy ``A_r`` chunk by chunk into ``p``'s inbox with the copy engine
  (``cuMemcpyAsync`` over NVLink), each chunk followed by a stream-ordered release of ``p``'s flag for
  ``(r, chunk)`` (the epoch, stored by a 1-warp kernel, :func:`..common.signal.signal`, or a memop
  token, below). Every rank sends to ``r-1`` first, so rank ``r`` receives ``r+1``'s rows first, then
  ``r+2``'s: the order its tiles take. ``gather_dim=1`` sends chunk-major (chunk 0 to every peer first):
  every tile there needs every peer;
* the caller's stream: one persistent GEMM (:func:`..consume.consume_tiles`, or its TMA form
  :func:`..consume_tma.consume_tiles_tma`: the consumer of ``push`` / ``push_tma``, imported unchanged)
  over all of ``C``'s tiles. gather_dim=0: the local shard's row tiles first (read from the user's
  tensor, never waiting), then ``r+1``'s, ``r+2``'s, ... (rank-rotated, grouped inside one shard), each
  tile waiting (acquire loads at system scope, bounded by the watch slot) for the flags of the chunks its
  rows come from; tiles are drawn from a queue so programs that finish early take the next ones;
* then it tells every peer that its inbox has been consumed and joins the lanes
  (:func:`..common.channel.join_lanes`).

The channel (inbox arena, flags, ``done`` tokens, epoch, side stream) is the copy-engine family's
(:mod:`..common.channel`), with either back end: ``triton`` (the default; each flag a release kernel
storing the device-resident epoch, which the GEMM reads from device memory and compares each flag with:
nothing is reset) or ``memop`` (each flag a ``cuStreamWriteValue32`` of the token 1, no kernel and a few
microseconds less host time per flag; the GEMM waits for 1, and after it the rank takes every data token
back with one fill before its ``done`` tokens let the peers write the next call's). The tile queue's
position comes from a per-workspace arrival count (:func:`..common.sync.epoch_begin`), as in the fused
kernel. Nothing the host passes changes from call to call, so a CUDA graph replays either.

Hazards: (1) the flags (``triton``) and the ``done`` waits are kernels on the side streams, and the
GEMM's programs spin: a grid on every SM could hold all of them while the kernels that would release them
wait for an SM (deadlock until the bound). The grid is therefore at most ``num_sms - RESERVED_SMS``
programs: a flag or ``done`` kernel (1 warp, no shared memory) fits wherever one more GEMM program would.
(2) Inboxes are single-buffered: the ``done`` tokens keep a peer one call ahead from overwriting rows
still read. (3) Chunk flags are indexed by ``row // row_width`` on the device, so chunks are uniform (the
last one shorter), unlike :func:`..copy_engine.split_rows`' near-equal ones. (4) The rows a tile reads
after its acquire were written by a peer's copy engine, not by SM stores as in ``push``: the flag is
released behind the copy in stream order (``triton``: a system-scope release; ``memop``: the write's
default memory barrier), the same ordering ``copy_engine`` relies on; the GPU runs must confirm it for
the TMA loads too. (5) Unlike ``push``'s tiles, whose producers run in the same grid, most of this grid
waits on copies: at 4 ranks the tiles of the three peers' rows, every program at once, for the length of
a shard's copy (about 30-130 us at M=1024-4096, K=8192), longer than the watch's
:data:`~..common.watch.CHECK_AFTER_NS` (50 us until 2026-11-29's A/B, 10 ms since). The shared consumer's wait
(``spin_until``) then loads the slot's bound from pinned host memory on every poll: back-to-back PCIe
reads from every warp of up to 131 programs, on every GPU at once. The first 4-GPU run (2026-11-27)
stalled, 1.1-114 ms a call against BSP's 0.11-1.7 ms, in 47 of the 48 seeds timed at the six keys where
tiles wait that long (N=2048 and 2560 at every M, N=14336 at M=1024), and at neither key where the local
tiles' GEMM covers the copies (N=14336 at M=4096 and 16384: 1.5-3.1 and 6.0-6.7 ms, BSP 1.7 and 6.4 ms).
The tiles' waits here read the bound once per wait (:func:`spin_until_read_once`), and by default
only after :data:`LATE_CHECK_NS` (10 ms, ``late``); the shared consumer, unchanged, is recompiled with
that wait (:func:`with_globals`). Read once after 50 us (``once``, the default until 2026-11-29), the
bound still cost a PCIe read per waiting warp and call, and those reads ran one after another: on one
H200 with four ranks emulated, behind a gate so that every part starts together, the lanes' copies and
flags stopped for 420-440 us at once, 50 us into the GEMM (``torch.profiler``), and rank 0's GEMM took
507-704 us at M=1024 N=2560 against 199-246 with ``late`` (85 us with nothing to wait on); at M=4096
N=2560 ``once`` did not finish in minutes and ``late`` took 427-460 us
(``bench/results/2026-11-29_bound_reads_h200``). The 4-GPU run after the first fix (666 us and 1.7-2.0
ms at those keys, BSP 131 and 408) fits the same cost. ``$AUTOTAXER_CE_PERSISTENT_BOUND_READS`` =
``once`` or ``every`` runs the older waits, for the A/B on GPUs. (6) The copies must not need SMs, since
the grid leaves only :data:`RESERVED_SMS`. A same-device ``cuMemcpyAsync`` does need them: the driver
runs it as a copy kernel (``bench/copy_sm_probe.py``, one H200, 2026-11-29). So the one-GPU emulation
of this variant starves its own copies where its grid takes most SMs (part of the 199-246 us above).
Peer copies over NVLink are taken to run on the copy engine; ``bench/copy_sm_probe.py`` on two GPUs
checks that (not yet run). (7) A wait's give-up decision is the CTA's (``common.watch.past_bound``), and
``poll`` 1 and 2 pass their count of missing flags through the CTA too (:func:`_poll_load`): each warp's
own clock reading once let some warps give up while others polled on, which hung ``push`` and
``push_tma`` at mismatched barriers (``bench/results/2026-11-29_give_up_hang_h200``; this variant's waits
were changed the same way, checked under the interpreter and in its sm_90 PTX; on one H200, 2026-11-29, the
GPU test of waits that give up passes). (8) Tiles run in grouped order, a group's ``group_m`` row tiles
first, so a group wider than a chunk makes a shard's first tiles wait for its last chunk: the chunks do not
pipeline. With rows landing by copy engine (pinned host copies on one H200, ``bench/rank0_view.py --source
host``, M=4096 N=14336 K=8192 ``nk``, four chunks of two tile rows), rank 0's GEMM took 1.19x the larger of
the GEMM alone and the copies alone with ``group_m=8`` and 1.04x with 2, whose GEMM alone is 12% slower;
the tuner's third seed keeps the groups inside a chunk (``bench/results/2026-11-29_ce_arrivals_h200``).
(9) The tiles take the peers in a fixed order. Where every peer's rows land at once (side streams a peer
each), the tiles of ``r+1``'s last chunk wait while the others' have landed: with every peer's rows at
once, the GEMM ended 813 us after the last row instead of 262 (same run, ``group_m=8``). ``order=1``
sends chunk by chunk across the peers and takes the peers' tile groups in turn
(:func:`tile_at_chunk_major`, the shared consumers recompiled with it). At N=2560, where a chunk's 20 tiles
are far fewer than the grid's programs and the queue already lets programs pass a missing chunk, it took
1245 us against 1230; not measured where a chunk holds about a wave.

Measured once on 4 H200 before (5) (``bench/results/2026-11-27_ce_persistent_h200x4``); checked on ranks
emulated under Triton's interpreter (2, 4 and 8) and compiled for sm_90 by ``python -m
autotaxer.tools.wait_kernels``.
"""

from __future__ import annotations

import dataclasses
import os
import types
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from ...common import signal as sig
from ...common.channel import MAX_CHUNKS, fork_lanes, join_lanes
from ...common.gemm import TileConfig
from ...common.lanes import peer_lanes
from ...common.sync import epoch_begin
from ...common.tiles import grouped_tile, rotate
from ...common.tma import Scratch, scratch_allocator
from ...common.watch import BOUND, _hip, cta_uniform, give_up, now_ns, unnamed_slot
from .. import copy_engine as ce
from ..args import Chunks, Io, Layout, Sizes, Strides, Tiles
from ..consume import consume_tiles
from ..consume_tma import consume_tiles_tma
from ..fused import _CompiledLaunch, _specialization
from ..protocol import wait_all_k, wait_rows, wait_segment
from ..push_tma import tma_ready

#: SMs the persistent GEMM leaves free for the side streams' flag and ``done`` kernels (hazard 1).
RESERVED_SMS = 1
#: int64 words of a workspace's ``sync``: GEMM program arrivals (the call count), tiles drawn (the queue).
SYNC_WORDS = 2


@dataclass(frozen=True)
class CePersistentConfig(TileConfig):
    """The GEMM's tiles (:class:`TileConfig`), the transfer's ``chunks`` per peer shard (one flag each, at
    most :data:`MAX_CHUNKS`), the side ``streams`` the peers are dealt to, ``tma`` (1: TMA loads,
    NVIDIA sm_90+, where the tensors allow; else the ``cp.async`` consumer), ``poll`` (how the tiles
    read their flags, an index into :data:`POLLS`; 0 the kernel as first shipped) and ``order`` (0: a
    peer's chunks sent and its tiles taken one peer after another, as first shipped; 1, ``gather_dim=0``:
    both chunk by chunk across the peers, :func:`tile_at_chunk_major`)."""

    chunks: int = 4
    streams: int = 1
    tma: int = 0
    poll: int = 0
    order: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        super().validate()
        if not 1 <= self.chunks <= MAX_CHUNKS:
            raise ValueError(f"chunks: must be in 1..{MAX_CHUNKS}, got {self.chunks}")
        if self.streams < 1:
            raise ValueError(f"streams: must be >= 1, got {self.streams}")
        if self.tma not in (0, 1):
            raise ValueError(f"tma: must be 0 or 1, got {self.tma}")
        if not 0 <= self.poll < len(POLLS):
            raise ValueError(f"poll: must be in 0..{len(POLLS) - 1} ({', '.join(POLLS)}), got {self.poll}")
        if self.order not in (0, 1):
            raise ValueError(f"order: must be 0 or 1, got {self.order}")


def chunk_width(rows: int, chunks: int, block_m: int) -> int:
    """Rows per chunk: ``rows / chunks`` rounded up, and up to whole row tiles where the shard is made of
    whole tiles (a tile then waits on one chunk)."""
    if rows < 1 or chunks < 1:
        raise ValueError(f"chunks: {chunks} chunks of {rows} rows")
    width = -(-rows // chunks)
    if rows % block_m == 0:
        width = -(-width // block_m) * block_m
    return width


def chunk_major_error(rows: int, config: CePersistentConfig) -> str | None:
    """Why ``order=1`` cannot take a ``rows``-row shard's tiles chunk by chunk across the peers, else
    None: its tiles must not straddle two shards, and its tile groups (``group_m``, at most a shard) must
    cut a shard evenly (the order deals whole groups to the peers in turn)."""
    if rows % config.block_m:
        return f"order: 1 needs shards of whole row tiles ({rows} rows, block_m {config.block_m})"
    tiles = rows // config.block_m
    if tiles % min(config.group_m, tiles):
        return f"order: 1 needs group_m to cut a shard's {tiles} row tiles evenly (group_m {config.group_m})"
    return None


def uniform_rows(rows: int, width: int) -> tuple[tuple[int, int], ...]:
    """``(first row, row count)`` of chunks of ``width`` rows covering ``rows`` (the last one shorter)."""
    return tuple((first, min(width, rows - first)) for first in range(0, rows, width))


@dataclass(frozen=True)
class PersistentPlan:
    """A call's transfer (addresses, lanes, sends in issue order) and GEMM geometry."""

    base: ce.Plan  # peers in send order (r-1 first); chunk_rows uniform
    lanes: tuple[tuple[int, ...], ...]  # peers per side stream
    sends: tuple[tuple[int, int], ...]  # (peer, chunk) in issue order
    row_width: int  # rows per chunk (the device's flag index is row // row_width)
    gather_dim: int
    m: int
    n: int
    k: int
    config: CePersistentConfig
    programs: int  # the persistent grid

    @property
    def chunks(self) -> int:
        return len(self.base.chunk_rows)


def make_persistent_plan(channel: ce.Channel, *, m: int, n: int, k: int, gather_dim: int, elem: int,
                         config: CePersistentConfig, num_sms: int) -> PersistentPlan:  # fmt: skip
    """Resolve a call's addresses, chunks, lanes and grid (collective: may grow the channel's arena)."""
    config.validate()
    ws = channel.world_size
    if gather_dim not in (0, 1):
        raise ValueError(f"gather_dim: must be 0 or 1, got {gather_dim}")
    if (m if gather_dim == 0 else k) % ws:
        raise ValueError(f"shape: {'M' if gather_dim == 0 else 'K'} is not divisible by {ws} ranks")
    if num_sms <= RESERVED_SMS:
        raise ValueError(f"num_sms: {num_sms} leaves no SM for the GEMM ({RESERVED_SMS} reserved)")
    rows = m // ws if gather_dim == 0 else m
    width = chunk_width(rows, config.chunks, config.block_m)
    base = ce.make_plan(
        channel, m=m, k=k, gather_dim=gather_dim, elem=elem, chunks=1, order="reverse", gather_first=False,
        fp32_accumulate=False,
    )  # fmt: skip
    base = dataclasses.replace(base, chunk_rows=uniform_rows(rows, width))
    chunks = range(len(base.chunk_rows))
    if gather_dim == 0 and config.order == 1:
        reason = chunk_major_error(rows, config)
        if reason is not None:
            raise ValueError(reason)
    if gather_dim == 0 and config.order == 0:  # a peer's rows are consumed together: peer-major
        sends = tuple((p, c) for p in base.peers for c in chunks)
    else:  # chunk-major: order 1's tiles, or gather_dim=1's (every tile needs every peer's K-slice)
        sends = tuple((p, c) for c in chunks for p in base.peers)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    return PersistentPlan(
        base=base, lanes=peer_lanes(base.peers, config.streams), sends=sends, row_width=width,
        gather_dim=gather_dim, m=m, n=n, k=k, config=config, programs=min(num_sms - RESERVED_SMS, tiles),
    )  # fmt: skip


def _send_lane(ch: ce.Channel, plan: PersistentPlan, a_shard: Any, peers: tuple[int, ...],
               stream: Any) -> None:  # fmt: skip
    """On ``stream`` (the current stream): this rank's chunks for ``peers``, in the plan's issue order,
    each peer's first one after its ``done`` flag (it read the previous call's data), each chunk's flag
    raised behind its copy."""
    base = plan.base
    inbox_of, data_of = dict(base.remote_inbox), dict(base.remote_data)
    row_bytes = base.k_shard * base.elem
    src = a_shard.data_ptr()
    ready: set[int] = set()
    for p, c in plan.sends:
        if p not in peers:
            continue
        if p not in ready:
            ce._await(ch, ch.done[p : p + 1], stream, offset=-1)
            ready.add(p)
        first, n = base.chunk_rows[c]
        off = first * row_bytes
        sig.memcpy_async(inbox_of[p] + off, src + off, n * row_bytes, stream)
        ce._raise(ch, data_of[p] + 4 * c, stream)


# -- the tiles' waits: the watch slot's bound read once per wait (issue 47's stall) ----------------------

#: ``$AUTOTAXER_CE_PERSISTENT_BOUND_READS``, how a tile's wait reads the watch slot's bound (in pinned host
#: memory): ``late`` (the default) once, after the wait has spun :data:`LATE_CHECK_NS`; ``once`` once,
#: after :data:`TILE_CHECK_AFTER_NS` (the default before 2026-11-29); ``every`` on every poll after that (the
#: shared consumer's :func:`..common.watch.spin_until`). Read when a workspace first launches its GEMM.
BOUND_READS_ENV = "AUTOTAXER_CE_PERSISTENT_BOUND_READS"
BOUND_READS = ("late", "once", "every")
#: Nanoseconds a tile's wait spins before ``once`` reads the bound: 50 us, the shared waits' threshold
#: until 2026-11-29's A/B (:data:`CHECK_AFTER_NS` is 10 ms since).
TILE_CHECK_AFTER_NS = tl.constexpr(50_000)
#: ``late``'s threshold: longer than a tile waits in a working call (a shard's copy behind the host's
#: enqueue), so no PCIe read at all until a peer is really late. Reading after 50 us, every waiting warp
#: (480 of them at M=1024 N=2560, 80 programs) read pinned host memory about once per call, and those
#: reads ran one after another: 507-704 us a call on one H200 with four ranks emulated, 199-246 with
#: this (``bench/results/2026-11-29_bound_reads_h200``). A wait on a dead peer gives up after the larger
#: of this and the bound.
LATE_CHECK_NS = tl.constexpr(10_000_000)
_BOUND_WORD = tl.constexpr(BOUND)


def bound_reads() -> str:
    """``$AUTOTAXER_CE_PERSISTENT_BOUND_READS`` (``late`` unless set); ``ValueError`` naming it."""
    value = os.environ.get(BOUND_READS_ENV, "").strip() or "late"
    if value not in BOUND_READS:
        raise ValueError(f"{BOUND_READS_ENV}: expected one of {', '.join(BOUND_READS)}, got {value!r}")
    return value


@triton.jit
def _read_atomic(ptrs, live):
    """The flags of ``ptrs`` where ``live`` (0 elsewhere), each read by an atomic add of 0 with acquire
    semantics at system scope (the shared consumer's read)."""
    return tl.atomic_add(ptrs, 0, mask=live, sem="acquire", scope="sys")


@triton.jit
def _poll(ptrs, live, epoch):
    """``(seen, missing, pending)``: one acquire read (system scope, :func:`_read_atomic`) of the live
    flags of ``ptrs``, which of them are still below ``epoch``, and how many."""
    seen = _read_atomic(ptrs, live)
    missing = live & (seen < epoch)
    return seen, missing, tl.sum(missing.to(tl.int32), axis=0)


#: How a tile's wait reads its flags (:class:`CePersistentConfig`'s ``poll``, an index here; issue 47's
#: second stall candidate). ``atomic`` (0, the default, the shared consumer's read): an atomic add of 0
#: with acquire semantics at system scope, a read-modify-write of the flags' line, which at 4 ranks up to
#: 131 programs issue back to back on the same few lines (a peer's release and the local tiles' loads may
#: queue behind them in L2; not measured on real peers yet). ``load`` (1): ``ld.acquire.sys`` (NVIDIA), a
#: load that L2 serves to every poller without taking the line. ``sleep`` (2): that load, and a
#: ``nanosleep`` of :data:`SLEEP_NS` after each poll that finds a flag missing. Under the interpreter and
#: on AMD every mode reads by the atomic.
POLLS = ("atomic", "load", "sleep")
#: ``sleep``: nanoseconds a waiting warp sleeps between polls (the literal in :func:`_pause`'s asm).
SLEEP_NS = 256


if os.environ.get("TRITON_INTERPRET", "0") == "1" or _hip():
    _load_acquire = _read_atomic  # no ld.acquire here: the atomic read

    @triton.jit
    def _pause():
        """Sleep a little between polls (here: nothing)."""
        pass

else:

    @triton.jit
    def _load_acquire(ptrs, live):
        """The flags of ``ptrs`` where ``live`` (0 elsewhere), each read by ``ld.acquire.sys`` (predicated:
        a lane that is not live reads nothing)."""
        return tl.inline_asm_elementwise(
            "{ .reg .pred %p; setp.ne.b32 %p, $2, 0; mov.u32 $0, 0;"
            " @%p ld.global.acquire.sys.b32 $0, [$1]; }",
            "=r,l,r", [ptrs, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip

    @triton.jit
    def _pause():
        """Sleep :data:`SLEEP_NS` nanoseconds (``nanosleep``: the warp yields its issue slots)."""
        tl.inline_asm_elementwise(
            "nanosleep.u32 256; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def _poll_sleep(ptrs, live, epoch):
    """:func:`_poll_load`, then :func:`_pause` when a flag is still missing."""
    seen, missing, pending = _poll_load(ptrs, live, epoch)
    if pending > 0:
        _pause()
    return seen, missing, pending


@triton.jit
def spin_until_read_once(ptrs, live, epoch, watch_ptr, peer, idx, ok):
    """:func:`..common.watch.spin_until` (the same flags, loads, bound and record), except that the bound
    is loaded from the watch slot once, the first time the wait has spun :data:`TILE_CHECK_AFTER_NS`, and kept
    in a register. ``spin_until`` loads it on every poll after that: with every program of this grid
    spinning on a peer's chunk for longer than that (the tiles of 3 peers' rows at 4 ranks), that is one
    read of pinned host memory over PCIe per warp and poll, back to back, from up to 131 programs."""
    ok = tl.cast(ok, tl.int32)
    seen, missing, pending = _poll(ptrs, live, epoch)
    if (pending > 0) & (ok != 0):
        t0 = now_ns()
        bound = tl.full((), -1, tl.int64)  # not read yet
        while (pending > 0) & (ok != 0):
            seen, missing, pending = _poll(ptrs, live, epoch)
            if pending > 0:
                waited = now_ns() - t0
                over = tl.full((), 0, tl.int32)
                if waited > TILE_CHECK_AFTER_NS:  # each thread its own answer (cta_uniform says why)
                    if bound < 0:
                        bound = tl.load(watch_ptr + _BOUND_WORD, volatile=True)
                    over = (waited > bound).to(tl.int32)
                if cta_uniform(over) != 0:
                    first = tl.min(tl.where(missing, idx, 2**31 - 1), axis=0)
                    low = tl.min(tl.where(missing, seen, 2**31 - 1), axis=0)
                    give_up(watch_ptr, peer, first, epoch, low)
                    ok = 0
    return ok


def with_globals(fn: Any, **names: Any) -> Any:
    """The jitted function ``fn`` compiled again with the module globals ``names`` replaced: the same
    source (so the consumer stays ``push``'s, line for line), its own function, with ``fn``'s
    annotations (its constexpr parameters) and ``do_not_specialize``; ``fn`` is untouched."""
    py = fn.fn
    for name in names:
        if name not in py.__globals__:
            raise NameError(f"{py.__name__}: no global {name!r} to replace")
    scope = {**py.__globals__, **names}
    copy = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    copy.__qualname__ = py.__qualname__
    copy.__annotations__ = dict(py.__annotations__)  # which parameters are constexprs
    copy.__kwdefaults__ = py.__kwdefaults__
    return triton.jit(copy, do_not_specialize=getattr(fn, "do_not_specialize", None) or None)


def _wait_segment_spinning(spin: Any) -> Any:
    """:func:`..protocol.wait_segment` with every spin through ``spin``: the shared waits
    (:func:`..protocol.wait_rows`, the one this variant's ``WHOLE_K``-off tiles take, and
    :func:`..protocol.wait_all_k`), line for line, recompiled with that spin."""
    return with_globals(
        wait_segment, wait_rows=with_globals(wait_rows, spin_until=spin),
        wait_all_k=with_globals(wait_all_k, spin_until=spin),
    )  # fmt: skip


def _consumers_waiting(wait: Any) -> tuple[Any, Any]:
    """``(consume_tiles, consume_tiles_tma)`` with ``wait`` (a :func:`_wait_segment_spinning`) for their
    waits."""
    return with_globals(consume_tiles, wait_segment=wait), with_globals(consume_tiles_tma, wait_segment=wait)


#: The waits through :func:`spin_until_read_once`, and the consumers that take them.
wait_segment_read_once = _wait_segment_spinning(spin_until_read_once)
consume_tiles_read_once, consume_tiles_tma_read_once = _consumers_waiting(wait_segment_read_once)


@triton.jit
def _poll_load(ptrs, live, epoch):
    """:func:`_poll` with the flags read by :func:`_load_acquire` (``poll`` 1). The atomic read's values
    reach every warp through shared memory; these loads are each warp's own, and so is the count of
    missing flags. The count returned is thread 0's (:func:`~...common.watch.cta_uniform`), so that every
    warp takes the wait's loop and leaves it together: the give-up decision inside it synchronises the
    CTA, and a warp already past it would meet that barrier elsewhere."""
    seen = _load_acquire(ptrs, live)
    missing = live & (seen < epoch)
    return seen, missing, cta_uniform(tl.sum(missing.to(tl.int32), axis=0))


#: The consumers of ``poll`` 1 and 2: :func:`spin_until_read_once` with its flags read by
#: :func:`_poll_load` and :func:`_poll_sleep`.
consume_tiles_load, consume_tiles_tma_load = _consumers_waiting(
    _wait_segment_spinning(with_globals(spin_until_read_once, _poll=_poll_load))
)
consume_tiles_sleep, consume_tiles_tma_sleep = _consumers_waiting(
    _wait_segment_spinning(with_globals(spin_until_read_once, _poll=_poll_sleep))
)
#: ``late``: :func:`spin_until_read_once` reading the bound after :data:`LATE_CHECK_NS`, and the same six
#: consumers with their waits through it (by the names the kernel calls them).
spin_until_read_late = with_globals(spin_until_read_once, TILE_CHECK_AFTER_NS=LATE_CHECK_NS)
_LATE_CONSUMERS: dict[str, Any] = {}
for _name, _spin in (
    ("read_once", spin_until_read_late),
    ("load", with_globals(spin_until_read_late, _poll=_poll_load)),
    ("sleep", with_globals(spin_until_read_late, _poll=_poll_sleep)),
):
    _LATE_CONSUMERS[f"consume_tiles_{_name}"], _LATE_CONSUMERS[f"consume_tiles_tma_{_name}"] = (
        _consumers_waiting(_wait_segment_spinning(_spin))
    )


# one compiled kernel for every rank: ranks emulated in one process load it once (a load while a peer's
# GEMM spins can wait for it)
@triton.jit(do_not_specialize=["rank"])
def _ce_persistent_kernel(io, inbox_ptr, flags_ptr, epoch_ptr, sync_ptr, watch_ptr, rank, sizes, chunks,
                          strides, LAYOUT: tl.constexpr, TILES: tl.constexpr,
                          READ_BOUND_ONCE: tl.constexpr, POLL: tl.constexpr):  # fmt: skip
    """The GEMM of one call: every program runs tiles (no producers), the first ``grid`` dealt by program
    id, the rest drawn from the queue ``sync[1]``; each tile waits for the chunk flags of its peers' rows
    (``flags_ptr``: the channel's ``data``, ``[src, chunk]``) to reach the channel's epoch
    (``READ_BOUND_ONCE``: through :func:`spin_until_read_once`, its flags read as ``POLL`` says, the
    config's ``poll``; else the shared consumer's waits)."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    # this workspace's call number from the arrival count: where the queue stood at this call's start
    call_no = epoch_begin(sync_ptr, grid, True)
    queue = (sync_ptr + 1).to(tl.pointer_type(tl.int32))
    tiles = tl.cdiv(sizes.M, TILES.BLOCK_M) * tl.cdiv(sizes.N, TILES.BLOCK_N)
    offset = grid - (call_no - 1) * tiles  # int32, wrapping as the queue does
    epoch = tl.load(epoch_ptr)  # advanced on this stream before the launch
    call = (queue, inbox_ptr, flags_ptr, watch_ptr, rank, epoch)
    ok = tl.full((), 1, tl.int32)  # a tensor from the start: the waits reassign it (issue 35)
    if READ_BOUND_ONCE:
        if POLL == 1:
            if TILES.TMA:
                consume_tiles_tma_load(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
            else:
                consume_tiles_load(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
        elif POLL == 2:
            if TILES.TMA:
                consume_tiles_tma_sleep(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
            else:
                consume_tiles_sleep(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
        elif TILES.TMA:
            consume_tiles_tma_read_once(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
        else:
            consume_tiles_read_once(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
    else:
        if TILES.TMA:
            consume_tiles_tma(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)
        else:
            consume_tiles(pid, offset, call, ok, io, sizes, chunks, strides, LAYOUT, TILES)


KERNEL = _ce_persistent_kernel
#: The same kernel with the ``late`` waits (the default :func:`bound_reads`).
KERNEL_LATE = with_globals(_ce_persistent_kernel, **_LATE_CONSUMERS)


# -- order 1: the peers' tiles chunk by chunk across the peers ------------------------------------------

#: The world size :func:`tile_at_chunk_major` deals the peers' tile groups over (a constexpr global, set
#: for each compiled kernel by :func:`kernel_for`).
ORDER_WORLD = tl.constexpr(2)


@triton.jit
def tile_at_chunk_major(tile_id, num_pid_m, num_pid_n, group, first_local_m, GATHER_DIM: tl.constexpr):
    """``order=1``'s :func:`..consume.tile_at`: the local shard's tiles first, as there; then the peers'
    tile groups in turn, ``r+1``'s first group, ``r+2``'s first, ..., then every peer's second, so the
    tiles follow rows that land chunk by chunk from every peer at once (side streams a peer each, or
    chunk-major sends). Needs shards of whole row tiles cut evenly by ``group``
    (:func:`chunk_major_error`)."""
    pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, group)
    if GATHER_DIM == 0:
        shard = num_pid_m // ORDER_WORLD
        if pid_m >= shard:  # the peers' rows, in rotated order: position q of (ORDER_WORLD - 1) shards
            q = pid_m - shard
            g = q // group
            peer = g % (ORDER_WORLD - 1)
            pid_m = shard + peer * shard + (g // (ORDER_WORLD - 1)) * group + q % group
        pid_m = rotate(pid_m, first_local_m, num_pid_m)
    return pid_m, pid_n


#: The consumers the kernel calls, by the names it calls them (:data:`KERNEL`'s).
_CONSUMERS = {
    "consume_tiles": consume_tiles,
    "consume_tiles_tma": consume_tiles_tma,
    "consume_tiles_read_once": consume_tiles_read_once,
    "consume_tiles_tma_read_once": consume_tiles_tma_read_once,
    "consume_tiles_load": consume_tiles_load,
    "consume_tiles_tma_load": consume_tiles_tma_load,
    "consume_tiles_sleep": consume_tiles_sleep,
    "consume_tiles_tma_sleep": consume_tiles_tma_sleep,
}
_CHUNK_MAJOR: dict[tuple[str, int], Any] = {}


def kernel_for(reads: str, order: int = 0, world_size: int = 2) -> Any:
    """The GEMM kernel of a :data:`BOUND_READS` mode and an ``order`` (their arguments are the same);
    ``order=1``'s, one per ``world_size``, made once: every consumer with :func:`tile_at_chunk_major`."""
    if reads not in BOUND_READS:
        raise ValueError(f"reads: expected one of {', '.join(BOUND_READS)}, got {reads!r}")
    if order == 0:
        return KERNEL_LATE if reads == "late" else KERNEL
    if order != 1 or world_size < 2:
        raise ValueError(f"order: 1 (with 2+ ranks) or 0, got {order} ({world_size} ranks)")
    if (reads, world_size) not in _CHUNK_MAJOR:
        dealt = with_globals(tile_at_chunk_major, ORDER_WORLD=tl.constexpr(world_size))
        consumers = {**_CONSUMERS, **(_LATE_CONSUMERS if reads == "late" else {})}
        _CHUNK_MAJOR[reads, world_size] = with_globals(
            _ce_persistent_kernel, **{name: with_globals(fn, tile_at=dealt) for name, fn in consumers.items()}
        )
    return _CHUNK_MAJOR[reads, world_size]


def launch_args(plan: PersistentPlan, *, rank: int, world_size: int, inbox: Any, flags: Any, epoch: Any,
                sync: Any, a_shard: Any, b: Any, out: Any, watch: Any) -> tuple[int, list, dict]:  # fmt: skip
    """Check the call's tensors against ``plan``; ``(grid, the kernel's arguments in order, options)``.
    ``flags`` and ``epoch`` are the channel's ``data`` and ``epoch``, ``inbox`` its arena in A's dtype."""
    config, gather_dim = plan.config, plan.gather_dim
    ms, ks = a_shard.shape
    want = (plan.m // world_size, plan.k) if gather_dim == 0 else (plan.m, plan.k // world_size)
    if (ms, ks) != want or tuple(b.shape) != (plan.k, plan.n) or tuple(out.shape) != (plan.m, plan.n):
        raise ValueError(
            f"shapes: shard {tuple(a_shard.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} are not the "
            f"plan's {plan.m}x{plan.n}x{plan.k} over {world_size} ranks (gather_dim={gather_dim})"
        )
    if a_shard.stride(1) != 1 or not a_shard.is_contiguous():
        raise ValueError("a_shard: must be contiguous (the copy engine moves whole rows)")
    if sync.numel() < SYNC_WORDS or sync.element_size() != 8:
        raise ValueError(f"sync: {SYNC_WORDS} int64 words needed")
    elem = a_shard.element_size()
    aligned = (ks * elem) % 16 == 0 and a_shard.data_ptr() % 16 == 0 and inbox.data_ptr() % 16 == 0
    tma = bool(config.tma) and tma_ready(a_shard, b, inbox, gather_dim, config) is None
    args = dict(
        io=Io(a_shard, b, out), inbox_ptr=inbox, flags_ptr=flags, epoch_ptr=epoch, sync_ptr=sync,
        watch_ptr=watch, rank=rank, sizes=Sizes(plan.m, plan.n, plan.k, ms, ks),
        chunks=Chunks(plan.row_width, MAX_CHUNKS, ks, 1),
        strides=Strides(a_shard.stride(0), b.stride(0), b.stride(1), out.stride(0), out.stride(1)),
        LAYOUT=Layout(
            WORLD_SIZE=world_size, GATHER_DIM=gather_dim, B_ROW_MAJOR=b.stride(1) == 1,
            EVEN_K=ks % config.block_k == 0, EVEN_N=plan.n % config.block_n == 0, ALIGNED=aligned,
        ),
        TILES=Tiles(
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
            WHOLE_K=False, GROUP_ACROSS=False, PREFETCH_K=0, TMA=tma,
        ),
        READ_BOUND_ONCE=bound_reads() != "every", POLL=config.poll,
    )  # fmt: skip
    names = KERNEL.arg_names
    if set(names) != set(args):
        raise TypeError(f"{KERNEL.__name__}: parameters {names} do not match the launcher's {sorted(args)}")
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return plan.programs, [args[a] for a in names], options


def launch_gemm(ch: ce.Channel, plan: PersistentPlan, inbox: Any, a_shard: Any, b: Any, out: Any, sync: Any,
                watch: Any, cache: dict | None = None, token: Any = None) -> None:  # fmt: skip
    """The persistent GEMM on the current stream (after the epoch advanced); ``cache``: compiled launches
    by the tensors' specialisation, owned by one workspace. Its tiles wait until their flags reach the
    channel's epoch (``triton`` back end) or the value in ``token`` (``memop``: a 1-element int32 tensor
    holding 1, the token a stream memop writes)."""
    spec = _specialization(a_shard, b, out) if cache is not None else None
    compiled = cache.get(spec) if cache is not None else None
    if compiled is not None:
        compiled(a_shard, b, out)
        return
    grid, args, options = launch_args(
        plan, rank=ch.rank, world_size=ch.world_size, inbox=inbox,
        flags=ch.data, epoch=ch.epoch if ch.backend == "triton" else token, sync=sync, a_shard=a_shard, b=b,
        out=out, watch=watch,
    )  # fmt: skip
    scratch = None
    if args[KERNEL.arg_names.index("TILES")].TMA:  # the device-made descriptors' scratch
        scratch = cache.setdefault("tma_scratch", Scratch()) if cache is not None else Scratch()
    with scratch_allocator(scratch):
        handle = kernel_for(bound_reads(), plan.config.order, ch.world_size)[(grid,)](*args, **options)
    if cache is not None and hasattr(handle, "run") and len(cache) < 64:  # compiled (not the interpreter)
        cache[spec] = _CompiledLaunch(handle, grid, [None, *args[1:]], scratch)


def begin_call(ch: ce.Channel, plan: PersistentPlan, a_shard: Any, watch: Any) -> tuple[Any, Any]:
    """Advance the epoch and start the lanes' copies and flags; ``(main stream, lanes)``."""
    return fork_lanes(ch, plan.lanes, watch, _send_lane, ch, plan, a_shard)


def end_call(ch: ce.Channel, plan: PersistentPlan, main: Any, lanes: Any) -> None:
    """Tell every peer its data here was consumed (``memop``: first take every data token back, which a
    peer writes again only after this rank's ``done`` token); join the lanes into ``main``."""
    if ch.backend == "memop":
        _clear_tokens(ch, main)
    join_lanes(ch, plan.base.remote_done, main, lanes)


def _clear_tokens(ch: ce.Channel, stream: Any) -> None:
    """``memop``: every data token of this rank back to 0 on ``stream`` (``cuMemsetD32Async``: no kernel,
    so nothing to load lazily while this rank's GEMM may still spin, and no SM)."""
    drv = sig._driver()
    result = drv.cuMemsetD32Async(
        drv.CUdeviceptr(ch.data.data_ptr()), 0, ch.data.numel(), sig._stream(stream)
    )
    sig._check(result, "cuMemsetD32Async")


def ag_gemm_ce_persistent(channel: ce.Channel, plan: PersistentPlan, inbox: Any, a_shard: Any, b: Any,
                          out: Any, sync: Any, watch: Any = None, cache: dict | None = None,
                          token: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` with the copy engine and one persistent GEMM; collective.

    ``inbox`` is the channel's arena viewed as ``a_shard``'s dtype; ``sync`` the workspace's
    :data:`SYNC_WORDS` int64 words (zeroed once); ``watch`` the watch slot bounding every wait on a peer
    (None: the process's slot for unnamed launches); ``cache`` and ``token`` (needed with the ``memop`` back
    end) as in :func:`launch_gemm`. Launches only: no host synchronisation, no allocation after the first
    call.
    """
    if watch is None:
        watch = unnamed_slot(a_shard.device)
    if channel.backend == "memop" and token is None:
        raise ValueError("token: the memop back end needs the 1-element int32 tensor holding 1")
    main, lanes = begin_call(channel, plan, a_shard, watch)
    launch_gemm(channel, plan, inbox, a_shard, b, out, sync, watch, cache, token)
    end_call(channel, plan, main, lanes)
    return out
