"""``ce_persistent`` on N ranks emulated in one process on CPU (Triton's interpreter), for the tests.

Each rank has a channel over CPU buffers (:class:`HostChannel`: inbox arena, ``data`` flags, ``done``
tokens, the device-resident epoch), peers' addresses translated buffer by buffer. The transport runs on
the host (:func:`host_transport`): copies by ``memmove``, a flag raised by writing the raising rank's
epoch (what the signal kernel stores) or the memop token, tokens cleared by a host fill, streams and
events as no-ops. The GEMM is the real kernel, interpreted. Calls run in phases, every rank's sends
before any rank's GEMM (the interpreter runs programs one after another, so nothing may spin on work not
yet run); a ``done`` token a send needs and that no peer raised yet is an error, not a wait. What this
checks: the flag slots and epochs the GEMM waits on, the tile order and chunk geometry, the inbox slots,
the ``done`` protocol and the queue over several calls with no reset, and the result against fp32, with
fresh inputs, NaN-poisoned outputs and inboxes. Not the overlap.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any


class _Nothing:
    """A stream or event: the phases already order what the real ones would."""

    def record(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass


class HostChannel:
    """Rank ``rank``'s copy-engine channel of back end ``backend`` (``triton``: epochs; ``memop``: tokens,
    the ``done`` ones starting free) over CPU tensors; ``ranks`` is every rank's channel (for address
    translation)."""

    def __init__(
        self, rank: int, world_size: int, ranks: list, arena_bytes: int, backend: str = "triton"
    ) -> None:
        import torch

        from autotaxer.kernels.common.channel import MAX_CHUNKS

        self.rank, self.world_size, self.ranks, self.backend = rank, world_size, ranks, backend
        self.data = torch.zeros(world_size * MAX_CHUNKS, dtype=torch.int32)
        self.done = torch.full((world_size,), 1 if backend == "memop" else 0, dtype=torch.int32)
        self.epoch = torch.zeros(1, dtype=torch.int32)
        self._arena = torch.zeros(arena_bytes, dtype=torch.uint8)
        self.side, self.fork, self.join = _Nothing(), _Nothing(), _Nothing()
        self.watch: Any = None

    def arena(self, nbytes: int) -> Any:
        if nbytes > self._arena.numel():
            raise ValueError(f"arena: {nbytes} bytes needed, {self._arena.numel()} emulated")
        return self._arena

    def _buffers(self) -> list:
        return [self._arena, self.data, self.done]

    def remote(self, ptr: int, peer: int) -> int:
        for mine, theirs in zip(self._buffers(), self.ranks[peer]._buffers(), strict=True):
            base, size = mine.data_ptr(), mine.numel() * mine.element_size()
            if base <= ptr < base + size:
                return theirs.data_ptr() + (ptr - base)
        raise AssertionError(f"rank {self.rank}: address {ptr:#x} is in none of its heap buffers")


class HostWatch:
    """A watch slot on the CPU board whose bound is far away (``tensor``: what a launcher takes as
    ``watch``): in a phased run every flag is up before any GEMM waits, so no wait may give up."""

    def __init__(self) -> None:
        from autotaxer.kernels.common.watch import board

        slots = board("cpu")
        self.tensor = slots.tensor(slots.claim(int(2e9)))


def host_workspaces(key: Any, params: dict, ranks: list, plans: list, dtype: Any) -> list:
    """A copy-engine variant's workspace per rank of ``ranks`` (:class:`HostChannel`): its plan of
    ``plans``, its inbox viewed as ``dtype`` and poisoned with NaN, and a :class:`HostWatch`."""
    from autotaxer.ops import Workspace

    workspaces = []
    for ch, plan in zip(ranks, plans, strict=True):
        inbox = ch.arena(0).view(dtype)
        inbox.fill_(float("nan"))
        buffers = {"channel": ch, "plan": plan, "inbox": inbox, "watch": HostWatch()}
        workspaces.append(Workspace(key, dict(params), buffers))
    return workspaces


@contextlib.contextmanager
def host_transport() -> Iterator[None]:
    """The copy engine, the flag kernels and the streams replaced by host operations (module docstring)
    while the block runs."""
    import torch

    import autotaxer.kernels.ag_gemm.copy_engine as ce
    import autotaxer.kernels.ag_gemm.experimental.ce_persistent as cp
    import autotaxer.kernels.common.channel as channel
    import autotaxer.kernels.common.signal as sig

    def _raise(ch: HostChannel, addr: int, stream: Any) -> None:
        ctypes.c_int32.from_address(addr).value = 1 if ch.backend == "memop" else int(ch.epoch[0])

    def _await(ch: HostChannel, flag: Any, stream: Any, offset: int = 0) -> None:
        if ch.backend == "memop":  # the token protocol: wait for 1, hand it back
            if int(flag[0]) != 1:
                raise AssertionError(f"rank {ch.rank}: a token holds {int(flag[0])}, 1 due (not raised yet)")
            flag[0] = 0
            return
        due = int(ch.epoch[0]) + offset
        if int(flag[0]) < due:
            raise AssertionError(f"rank {ch.rank}: a flag holds {int(flag[0])}, {due} due (not raised yet)")

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    try:
        for module in (channel, ce):
            patch(module, "_raise", _raise)
            patch(module, "_await", _await)
        patch(sig, "memcpy_async", lambda dst, src, n, stream: ctypes.memmove(dst, src, n))
        patch(cp, "_clear_tokens", lambda ch, stream: ch.data.zero_())
        patch(channel, "lane_streams", lambda ch, n: [(_Nothing(), _Nothing()) for _ in range(n)])
        patch(torch.cuda, "current_stream", lambda *a: _Nothing())
        patch(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def check_ce_persistent(
    world_size: int,
    gather_dim: int,
    m: int,
    n: int,
    k: int,
    config: Any,
    *,
    b_layout: str = "kn",
    signal: str = "triton",
    calls: int = 2,
    dtype: Any = None,
    num_sms: int = 4,
    seed: int = 0,
) -> str:
    """``calls`` calls of ``ce_persistent`` on ``world_size`` emulated ranks with the flags' back end
    ``signal`` (fresh random inputs, outputs and inboxes poisoned with NaN); every call's outputs kept and
    checked again after the last call.
    Returns ``"OK ..."`` (``tma=True``: the TMA consumer ran); ``AssertionError`` naming the call, rank and
    what differed."""
    import torch

    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
    from autotaxer.kernels.ag_gemm.push_tma import tma_ready
    from autotaxer.kernels.common.channel import MAX_CHUNKS
    from autotaxer.kernels.common.watch import board
    from autotaxer.ops._emulated_heap import emulated_error

    dtype = dtype or torch.float32
    ws, gd = world_size, gather_dim
    ms, ks = (m // ws, k) if gd == 0 else (m, k // ws)
    elem = torch.empty((), dtype=dtype).element_size()
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * ms * ks * elem, signal) for r in range(ws))
    plans = [
        cp.make_persistent_plan(ch, m=m, n=n, k=k, gather_dim=gd, elem=elem, config=config, num_sms=num_sms)
        for ch in ranks
    ]
    token = torch.ones(1, dtype=torch.int32)
    syncs = [torch.zeros(cp.SYNC_WORDS, dtype=torch.int64) for _ in ranks]
    slots = board("cpu")
    slot = slots.claim(int(2e9))  # every flag is up before any GEMM runs: no wait may give up
    watch = slots.tensor(slot)
    gen = torch.Generator().manual_seed(seed)
    kept: list[tuple[int, list, Any]] = []
    for call in range(1, calls + 1):
        shards = [torch.randn(ms, ks, generator=gen).to(dtype) for _ in ranks]
        if b_layout == "nk":
            b = torch.randn(n, k, generator=gen).to(dtype).t()
        else:
            b = torch.randn(k, n, generator=gen).to(dtype)
        outs = [torch.full((m, n), float("nan"), dtype=dtype) for _ in ranks]
        for ch in ranks:
            ch.arena(0).view(dtype).fill_(float("nan"))
        with host_transport():
            started = [cp.begin_call(ch, plans[r], shards[r], watch) for r, ch in enumerate(ranks)]
            for r, ch in enumerate(ranks):
                inbox = ch.arena(0).view(dtype)
                cp.launch_gemm(ch, plans[r], inbox, shards[r], b, outs[r], syncs[r], watch, token=token)
                cp.end_call(ch, plans[r], *started[r])
        gave_up = slots.gave_up(slot)
        assert gave_up == 0, f"ce_persistent ws{ws} call {call}: {gave_up} waits gave up ({slots.read(slot)})"
        ref = torch.cat([s.double() for s in shards], dim=gd) @ b.double()
        kept.append((call, outs, ref))
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for r, ch in enumerate(ranks):
            where = f"ce_persistent ws{ws} gd{gd} {b_layout} call {call} rank {r}"
            err = emulated_error(outs[r], ref)
            assert err < tol, f"{where}: relative error {err:.2e}"
            memop = signal == "memop"  # tokens: every data token taken back, every done token free again
            assert int(ch.epoch[0]) == (0 if memop else call), f"{where}: epoch {int(ch.epoch[0])}"
            flags = ch.data.view(ws, MAX_CHUNKS)
            for src in range(ws):
                raised = flags[src, : plans[r].chunks].tolist()
                want = [0 if src == r or memop else call] * plans[r].chunks
                assert raised == want, f"{where}: rank {src}'s chunk flags hold {raised}, {want} due"
                if src != r:
                    landed = ch.arena(0).view(dtype)[src * ms * ks : (src + 1) * ms * ks].view(ms, ks)
                    assert torch.equal(landed, shards[src]), (
                        f"{where}: rank {src}'s shard differs in the inbox"
                    )
            done = ch.done.tolist()
            want = [1] * ws if memop else [0 if p == r else call for p in range(ws)]
            assert done == want, f"{where}: done flags {done}, {want} due"
            arrivals = int(syncs[r][0])
            assert arrivals == call * plans[r].programs, f"{where}: {arrivals} arrivals"
    slots.release(slot)
    for call, outs, ref in kept:  # no later call wrote an earlier call's output
        for r, out in enumerate(outs):
            err = emulated_error(out, ref)
            assert err < 1e-2, f"ce_persistent call {call} rank {r}: output changed later ({err:.2e})"
    tma = bool(config.tma) and tma_ready(shards[0], b, ranks[0].arena(0).view(dtype), gd, config) is None
    return (
        f"OK ce_persistent ws{ws} gd{gd} {b_layout} {signal} {m}x{n}x{k} chunks={plans[0].chunks} tma={tma}"
    )


def check_withheld_chunk(world_size: int, m: int, n: int, k: int, config: Any, *, peer: int, chunk: int,
                         bound_s: float = 0.2) -> str:  # fmt: skip
    """One gather_dim=0 call on rank 0 of ``world_size`` emulated ranks where ``peer`` sends everything but
    chunk ``chunk`` (neither its rows nor its flag): rank 0's GEMM must give up on exactly that flag within
    about ``bound_s`` (the watch slot names the peer and the flag ``peer * MAX_CHUNKS + chunk``), and every
    row of the output outside that chunk must still be right (the other tiles waited on their own flags
    only). Shards must be whole row tiles (``M / world_size`` a multiple of ``block_m``)."""
    import torch

    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
    from autotaxer.kernels.common.channel import MAX_CHUNKS
    from autotaxer.kernels.common.watch import board
    from autotaxer.ops._emulated_heap import emulated_error

    ws = world_size
    ms = m // ws
    if ms % config.block_m:
        raise ValueError(f"m: {ms}-row shards are not whole {config.block_m}-row tiles")
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * ms * k * 4) for r in range(ws))
    plans = [
        cp.make_persistent_plan(ch, m=m, n=n, k=k, gather_dim=0, elem=4, config=config, num_sms=4)
        for ch in ranks
    ]
    plans[peer] = cp.dataclasses.replace(plans[peer], sends=tuple(s for s in plans[peer].sends
                                                                  if s != (0, chunk)))  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    shards = [torch.randn(ms, k, generator=gen) for _ in ranks]
    b = torch.randn(k, n, generator=gen)
    out = torch.full((m, n), float("nan"))
    ranks[0].arena(0).view(torch.float32).fill_(float("nan"))
    watch = board("cpu")
    slot = watch.claim(int(bound_s * 1e9))
    try:
        with host_transport():
            for r, ch in enumerate(ranks):
                cp.begin_call(ch, plans[r], shards[r], watch.tensor(slot))
            sync = torch.zeros(cp.SYNC_WORDS, dtype=torch.int64)
            inbox = ranks[0].arena(0).view(torch.float32)
            cp.launch_gemm(ranks[0], plans[0], inbox, shards[0], b, out, sync, watch.tensor(slot))
        record = watch.read(slot)
    finally:
        watch.release(slot)
    flag = peer * MAX_CHUNKS + chunk
    assert record.count >= 1, "rank 0's GEMM did not give up on the withheld chunk"
    assert (record.peer, record.index) == (peer, flag), f"gave up on peer {record.peer} flag {record.index}"
    assert (record.expected, record.seen) == (1, 0), record
    first, rows = plans[peer].base.chunk_rows[chunk]
    lost = torch.zeros(m, dtype=torch.bool)
    lost[peer * ms + first : peer * ms + first + rows] = True
    ref = torch.cat([s.double() for s in shards]) @ b.double()
    err = emulated_error(out[~lost], ref[~lost])
    assert err < 1e-5, f"rows outside the withheld chunk: relative error {err:.2e}"
    assert out[lost].isnan().all(), "the withheld chunk's rows were computed from data that never landed"
    return f"OK withheld ws{ws} peer {peer} chunk {chunk}: gave up on flag {flag}"


def never_signal(world_size: int = 2, timeout_s: float = 0.3) -> Any:
    """Rank 0's GEMM of ``world_size`` emulated ranks whose peers never run (no peer flag is ever raised),
    with a watch slot of ``timeout_s`` named for ``ag_gemm``/``ce_persistent``: its waits must give up and
    :func:`autotaxer.ops._peer_wait.check` raise. Returns the
    :class:`~autotaxer.ops._peer_wait.PeerTimeoutError` (``AssertionError`` when none is raised)."""
    import torch

    from autotaxer._problem import ProblemKey
    from autotaxer._target import cpu_target
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
    from autotaxer.ops import RunContext
    from autotaxer.ops._peer_wait import PeerTimeoutError, check

    ws = world_size
    m, n, k = 16 * ws, 32, 32
    key = ProblemKey.make("ag_gemm", "cpu", ws, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": 0})
    dev = torch.device("cpu")
    ctx = RunContext(rank=0, world_size=ws, device=dev, target=cpu_target(), peer_timeout_s=timeout_s,
                     first_call_timeout_s=timeout_s)  # fmt: skip
    slot = ctx.watch_slot(key, "ce_persistent")
    config = cp.CePersistentConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                                   chunks=1)  # fmt: skip
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * (m // ws) * k * 4) for r in range(ws))
    plan = cp.make_persistent_plan(ranks[0], m=m, n=n, k=k, gather_dim=0, elem=4, config=config, num_sms=4)
    gen = torch.Generator().manual_seed(0)
    shard, b = torch.randn(m // ws, k, generator=gen), torch.randn(k, n, generator=gen)
    out = torch.empty(m, n)
    sync = torch.zeros(cp.SYNC_WORDS, dtype=torch.int64)
    try:
        with host_transport():
            started = cp.begin_call(ranks[0], plan, shard, slot.tensor)  # rank 0's own sends go out
            cp.launch_gemm(
                ranks[0], plan, ranks[0].arena(0).view(torch.float32), shard, b, out, sync, slot.tensor
            )
            cp.end_call(ranks[0], plan, *started)
        check(dev)
    except PeerTimeoutError as exc:
        return exc
    finally:
        del slot
    raise AssertionError("ce_persistent: rank 0's waits ended without giving up")


class _SteppedClock:
    """The interpreter's clock for the watch module (``now_ns``): every reading ``step_ns`` later than the
    last, and ``actions[n]()`` run at the ``n``-th reading; the rest of :mod:`time` as it is."""

    def __init__(self, step_ns: int, actions: dict[int, Any]) -> None:
        import time

        self._time, self.step_ns, self.actions = time, step_ns, actions
        self.readings, self.now = 0, time.monotonic_ns()

    def monotonic_ns(self) -> int:
        self.readings += 1
        self.now += self.step_ns
        action = self.actions.get(self.readings)
        if action is not None:
            action()
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(self._time, name)


def check_bound_read_once(
    reads: str, bound_ms: int = 100, late_ms: int = 300, raise_ms: int | None = 10
) -> str:
    """Rank 0 of 2 emulated ranks waits on rank 1's one chunk, withheld, on a clock that advances 1 ms a
    reading (:class:`_SteppedClock`): ``raise_ms`` into the wait (None: never) the host raises the watch
    slot's bound from ``bound_ms`` to 1000 s; at ``late_ms`` the chunk lands and its flag goes up. With
    ``$AUTOTAXER_CE_PERSISTENT_BOUND_READS`` = ``reads`` and the bound raised at 10 ms: ``once`` must give
    up at ``bound_ms`` (the wait kept the bound it read once, 1 ms in); ``every`` (it read the new bound
    on a later poll) and ``late`` (it read the bound first after 10 ms, already raised) must not, and must
    compute every row. With the bound never raised (``bound_ms`` under 10): every mode gives up, ``once``
    and ``every`` at ``bound_ms``, ``late`` not before 10 ms (no read of the bound before then). Returns
    ``"OK ..."``; ``AssertionError`` otherwise."""
    import os

    import torch

    import autotaxer.kernels.common.watch as watch_module
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
    from autotaxer.kernels.common.channel import MAX_CHUNKS
    from autotaxer.kernels.common.watch import BOUND, SLOT_WORDS, board
    from autotaxer.ops._emulated_heap import emulated_error

    if reads not in cp.BOUND_READS:
        raise ValueError(f"reads: expected one of {cp.BOUND_READS}, got {reads!r}")
    ws, m, n, k = 2, 32, 32, 16
    config = cp.CePersistentConfig(block_m=16, block_n=32, block_k=16, group_m=1, num_warps=4, num_stages=2,
                                   chunks=1)  # fmt: skip
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * (m // ws) * k * 4) for r in range(ws))
    plans = [
        cp.make_persistent_plan(ch, m=m, n=n, k=k, gather_dim=0, elem=4, config=config, num_sms=4)
        for ch in ranks
    ]
    plans[1] = cp.dataclasses.replace(plans[1], sends=())  # rank 1's chunk for rank 0: sent late, below
    gen = torch.Generator().manual_seed(2)
    shards = [torch.randn(m // ws, k, generator=gen) for _ in ranks]
    b = torch.randn(k, n, generator=gen)
    out = torch.full((m, n), float("nan"))
    inbox = ranks[0].arena(0).view(torch.float32)
    inbox.fill_(float("nan"))
    slots = board("cpu")
    slot = slots.claim(bound_ms * 1_000_000)
    bound_word = SLOT_WORDS * (slot + 1) + BOUND

    def raise_bound() -> None:
        slots.view[bound_word] = 1000 * 1_000_000_000

    def land() -> None:
        rows = m // ws
        inbox[rows * k : 2 * rows * k] = shards[1].reshape(-1)
        ranks[0].data[1 * MAX_CHUNKS] = int(ranks[1].epoch[0])

    actions = {late_ms: land} if raise_ms is None else {raise_ms: raise_bound, late_ms: land}
    clock = _SteppedClock(1_000_000, actions)
    saved_env, saved_time = os.environ.get(cp.BOUND_READS_ENV), watch_module.time
    os.environ[cp.BOUND_READS_ENV] = reads
    try:
        with host_transport():
            for r, ch in enumerate(ranks):
                cp.begin_call(ch, plans[r], shards[r], slots.tensor(slot))
            sync = torch.zeros(cp.SYNC_WORDS, dtype=torch.int64)
            watch_module.time = clock
            cp.launch_gemm(ranks[0], plans[0], inbox, shards[0], b, out, sync, slots.tensor(slot))
        record = slots.read(slot)
    finally:
        watch_module.time = saved_time
        if saved_env is None:
            os.environ.pop(cp.BOUND_READS_ENV, None)
        else:
            os.environ[cp.BOUND_READS_ENV] = saved_env
        slots.release(slot)
    ref = torch.cat([s.double() for s in shards]) @ b.double()
    peer_rows = slice(m // ws, m)
    late_check_ms = cp.LATE_CHECK_NS.value // 1_000_000 if reads == "late" else 0
    if raise_ms is None:  # the bound holds: every mode gives up, ``late`` not before its first read
        assert record.count == 1, f"reads={reads}: {record.count} waits gave up, 1 due"
        due = max(bound_ms, late_check_ms)
        assert due <= clock.readings < due + 5, (
            f"reads={reads}: gave up after {clock.readings} ms, due at {due}"
        )
        assert out[peer_rows].isnan().all(), f"reads={reads}: rows computed from a chunk that had not landed"
    elif reads == "once":
        assert record.count == 1, f"reads=once: {record.count} waits gave up, 1 due (the bound read once)"
        assert (record.peer, record.index) == (1, MAX_CHUNKS), record
        assert clock.readings < late_ms, f"reads=once: the wait spun {clock.readings} ms, past the bound"
        assert out[peer_rows].isnan().all(), "reads=once: rows computed from a chunk that had not landed"
    else:
        assert record.count == 0, (
            f"reads={reads}: {record.count} waits gave up (the raised bound was not read)"
        )
        assert clock.readings >= late_ms, f"reads={reads}: the wait ended after {clock.readings} ms"
        err = emulated_error(out, ref)
        assert err < 1e-5, f"reads={reads}: relative error {err:.2e} after the late chunk"
    err = emulated_error(out[: m // ws], ref[: m // ws])
    assert err < 1e-5, f"reads={reads}: the local rows' relative error {err:.2e}"
    return f"OK bound reads={reads}: {record.count} gave up after {clock.readings} clock readings"
