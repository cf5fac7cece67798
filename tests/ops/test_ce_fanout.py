"""``ce_fanout``'s schedule on the CPU: peers dealt to lanes, contiguous runs of peers per GEMM, the plan
built against a stand-in channel, and the variant's pruning. (The copies themselves need GPUs:
``tests/test_ag_gemm_gpu.py`` runs it at four.)"""

from __future__ import annotations

import pytest
from autotaxer.kernels.ag_gemm.experimental.ce_fanout import make_fanout_plan, peer_lanes, peer_runs
from autotaxer.kernels.common.channel import peer_order

from autotaxer._problem import ProblemKey
from autotaxer._target import Target
from autotaxer.ops import get_op, iter_grid
from autotaxer.testing.ce_persistent import HostChannel

H200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")


@pytest.mark.parametrize("world_size", [3, 4, 8])
@pytest.mark.parametrize("streams", [1, 2, 4, 8])
def test_every_peer_goes_to_exactly_one_lane_in_its_order(world_size: int, streams: int) -> None:
    for rank in range(world_size):
        peers = peer_order(rank, world_size, "rotated")
        lanes = peer_lanes(peers, streams)
        assert len(lanes) == min(streams, len(peers)) and all(lanes)
        assert sorted(p for lane in lanes for p in lane) == sorted(peers)
        for lane in lanes:  # each lane keeps the consumption order
            assert list(lane) == [p for p in peers if p in lane]


@pytest.mark.parametrize("world_size", [3, 4, 5, 8])
def test_runs_are_contiguous_and_follow_the_rotated_order(world_size: int) -> None:
    for rank in range(world_size):
        runs = peer_runs(rank, world_size)
        assert 1 <= len(runs) <= 2 and all(lo <= hi for lo, hi in runs)
        flat = [p for lo, hi in runs for p in range(lo, hi + 1)]
        assert flat == list(peer_order(rank, world_size, "rotated"))  # every peer once, arrival order


class _FakeChannel:
    """Just enough of ``copy_engine.Channel`` for ``make_plan``: addresses, no GPU."""

    class _Buf:
        def __init__(self, addr: int) -> None:
            self.addr = addr

        def data_ptr(self) -> int:
            return self.addr

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.data, self.done = self._Buf(0x1000), self._Buf(0x2000)
        self.arena_bytes = 0

    def arena(self, nbytes: int):
        self.arena_bytes = max(self.arena_bytes, nbytes)
        return self._Buf(0x10000)

    def remote(self, ptr: int, peer: int) -> int:
        return ptr + (peer << 40)


def test_plan_deals_every_peer_and_groups_gather_dim_0_rows() -> None:
    ch = _FakeChannel(rank=2, world_size=8)
    plan = make_fanout_plan(
        ch, m=1024, k=8192, gather_dim=0, elem=2, chunks=1, streams=4, gemms="range", fp32_accumulate=False
    )
    assert plan.runs == ((3, 7), (0, 1))
    assert sorted(p for lane in plan.lanes for p in lane) == [0, 1, 3, 4, 5, 6, 7] and len(plan.lanes) == 4
    assert ch.arena_bytes == 8 * 128 * 8192 * 2  # one slot per rank, in rank order
    assert dict(plan.base.remote_inbox)[5] == 0x10000 + 2 * 128 * 8192 * 2 + (5 << 40)  # my slot at peer 5
    per_peer = make_fanout_plan(
        ch, m=1024, k=8192, gather_dim=1, elem=2, chunks=2, streams=8, gemms="peer", fp32_accumulate=True
    )
    assert per_peer.runs == () and len(per_peer.lanes) == 7
    with pytest.raises(ValueError, match="gather_dim=0"):
        make_fanout_plan(
            ch,
            m=1024,
            k=8192,
            gather_dim=1,
            elem=2,
            chunks=1,
            streams=2,
            gemms="range",
            fp32_accumulate=False,
        )


def _key(world_size: int, gather_dim: int, m: int = 1024) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "nvidia-h200", world_size, "bf16", {"M": m, "N": 8192, "K": 8192},
                           {"gather_dim": gather_dim})  # fmt: skip


def test_check_prunes_what_cannot_run_or_repeats_another_point() -> None:
    v = get_op("ag_gemm").variants["ce_fanout"]
    ok = {"streams": 4, "gemms": "range", "signal": "triton", "chunks": 1, "accumulate": "out"}
    assert v.check(_key(8, 0), H200, ok) is None
    assert "at least 3 ranks" in v.check(_key(2, 0), H200, ok)
    assert "already gives each its own" in v.check(_key(4, 0), H200, {**ok, "streams": 8})
    assert v.check(_key(4, 0), H200, ok) is None  # 4 streams for 3 peers: one each
    assert "gather_dim=1" in v.check(_key(8, 1), H200, ok)
    assert "only 1 is useful" in v.check(_key(8, 0), H200, {**ok, "chunks": 2})
    assert v.check(_key(8, 0), H200, {**ok, "gemms": "peer", "chunks": 2}) is None
    assert "missing" in v.check(_key(8, 0), H200, {"streams": 1})
    # every valid point of the space behaves differently: lanes differ, or GEMMs, or chunks, or signal
    for ws in (3, 4, 8):
        space = v.search_space(_key(ws, 0), H200)
        valid = [p for p in iter_grid(space) if v.check(_key(ws, 0), H200, p) is None]
        peers = ws - 1
        assert {min(p["streams"], peers) for p in valid} == set(range(1, peers + 1)) & {1, 2, 4, peers}
        assert len({(min(p["streams"], peers), p["gemms"], p["chunks"], p["signal"]) for p in valid}) == len(
            valid
        )


def test_the_space_tunes_one_chunk_a_peer_at_gather_dim_0() -> None:
    """Several chunks a peer (one GEMM each) were retired at gather_dim=0 after losing at every 4-GPU key
    they were timed at; gather_dim=1 (never timed on peers) keeps them. Named explicitly, they still run."""
    v = get_op("ag_gemm").variants["ce_fanout"]
    assert v.search_space(_key(4, 0), H200)["chunks"] == (1,)
    assert v.search_space(_key(4, 1), H200)["chunks"] == (1, 2, 4)
    peer = {"streams": 4, "gemms": "peer", "signal": "triton", "chunks": 4, "accumulate": "out"}
    assert v.check(_key(4, 0), H200, peer) is None


# -- the whole schedule on an emulated heap: one thread per rank, CPU tensors, copies by memmove ---------


class _HeapChannel(HostChannel):
    """A rank's channel over CPU buffers: inbox arena (grown on demand), data flags and done tokens (memop
    protocol: tokens start free), peers' addresses translated buffer by buffer (``HostChannel``'s)."""

    backend = "memop"

    def __init__(self, rank: int, world_size: int, ranks: list) -> None:
        import torch
        from autotaxer.kernels.common.channel import MAX_CHUNKS

        self.rank, self.world_size, self.ranks = rank, world_size, ranks
        self.data = torch.zeros(world_size * MAX_CHUNKS, dtype=torch.int32)
        self.done = torch.ones(world_size, dtype=torch.int32)
        self._arena = None
        self.fork = _Nothing()

    def arena(self, nbytes: int):
        import torch

        if self._arena is None or self._arena.numel() < nbytes:
            self._arena = torch.zeros(nbytes, dtype=torch.uint8)
        return self._arena


def _heap_ranks(world_size: int, arena_bytes: int) -> list:
    """Every rank's :class:`_HeapChannel`, each arena already ``arena_bytes`` (collective on GPUs: every
    rank's arena exists before any address is translated)."""
    ranks: list = []
    ranks.extend(_HeapChannel(r, world_size, ranks) for r in range(world_size))
    for ch in ranks:
        ch.arena(arena_bytes)
    return ranks


class _Nothing:
    """A stream or event whose ordering the threads' flag waits already provide."""

    def record(self, *args) -> None:
        pass

    def wait_event(self, *args) -> None:
        pass


def _gathers_on_a_heap(world_size: int, gather_dim: int, make_plan, launch, b_layout: str = "kn") -> None:
    """Three calls of an all-gather schedule on every rank's thread: ``make_plan(channel, m, k)`` and
    ``launch(channel, plan, inbox, a_shard, b, out)``; every rank's ``out`` against the fp64 product.
    Fresh inputs every call (``b_layout="nk"``: B the transpose of an ``(N, K)`` tensor), outputs and
    inboxes poisoned with NaN before it."""
    import torch

    m, n, k = 8 * world_size, 24, 16 * world_size
    rows, ks = (m // world_size, k) if gather_dim == 0 else (m, k // world_size)
    ranks = _heap_ranks(world_size, world_size * rows * ks * 4)
    plans = [make_plan(ch, m, k) for ch in ranks]
    for call in range(3):  # the tokens carry over from call to call
        gen = torch.Generator().manual_seed(call)
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen) if b_layout == "kn" else torch.randn(n, k, generator=gen).t()
        shards = a.split(rows, 0) if gather_dim == 0 else a.split(ks, 1)
        outs = [torch.full((m, n), float("nan")) for _ in ranks]
        for ch in ranks:
            ch.arena(0).view(torch.float32).fill_(float("nan"))

        def rank_call(r: int, shards=shards, b=b, outs=outs) -> None:
            inbox = ranks[r].arena(0).view(torch.float32)
            launch(ranks[r], plans[r], inbox, shards[r].contiguous(), b, outs[r])

        _run_ranks(world_size, rank_call)
        ref = a.double() @ b.double()
        for r, out in enumerate(outs):
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"call {call} rank {r}: relative error {err}"


@pytest.mark.parametrize(
    ("world_size", "gather_dim", "gemms", "streams", "chunks"),
    [(3, 0, "range", 2, 1), (4, 0, "range", 1, 1), (4, 0, "peer", 4, 2), (8, 0, "range", 4, 1),
     (8, 0, "range", 8, 1), (4, 1, "peer", 2, 1), (8, 1, "peer", 8, 4)],
)  # fmt: skip
def test_schedule_gathers_and_multiplies_on_an_emulated_heap(
    monkeypatch, world_size: int, gather_dim: int, gemms: str, streams: int, chunks: int
) -> None:
    import autotaxer.kernels.ag_gemm.experimental.ce_fanout as fan

    _patch_transport(monkeypatch, fan)

    def make_plan(ch, m: int, k: int):
        return fan.make_fanout_plan(
            ch, m=m, k=k, gather_dim=gather_dim, elem=4, chunks=chunks, streams=streams, gemms=gemms,
            fp32_accumulate=False,
        )  # fmt: skip

    _gathers_on_a_heap(world_size, gather_dim, make_plan, fan.ag_gemm_ce_fanout)


# -- ce_grouped and gemm_rs's copy_engine: the same threads-as-ranks emulation ----------------------------


def _patch_transport(monkeypatch, *modules) -> None:
    """Copies by memmove (strided ones row by row), flags and tokens by host writes and polls, streams
    and events as no-ops, in the copy-engine channel and in ``modules`` (which import some by name)."""
    import contextlib
    import ctypes
    import time

    import autotaxer.kernels.ag_gemm.copy_engine as ce
    import autotaxer.kernels.common.channel as channel
    import autotaxer.kernels.common.signal as sig
    import torch

    def _await(ch, flag, stream, offset=0):
        deadline = time.monotonic() + 20
        while int(flag[0]) != 1:
            assert time.monotonic() < deadline, f"rank {ch.rank}: a flag was never raised"
            time.sleep(1e-4)
        flag[0] = 0

    def _copy2d(dst, dst_pitch, src, src_pitch, width, height, stream):
        for row in range(height):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    for module in (channel, ce):  # ag_gemm's schedules call the channel's helpers by the names they import
        monkeypatch.setattr(module, "_await", _await)
        monkeypatch.setattr(
            module, "_raise", lambda ch, addr, stream: setattr(ctypes.c_int32.from_address(addr), "value", 1)
        )
    monkeypatch.setattr(sig, "memcpy_async", lambda dst, src, n, stream: ctypes.memmove(dst, src, n))
    for module in (channel, *modules):
        if hasattr(module, "lane_streams"):
            monkeypatch.setattr(
                module, "lane_streams", lambda ch, n: [(_Nothing(), _Nothing()) for _ in range(n)]
            )
        if hasattr(module, "memcpy2d_async"):
            monkeypatch.setattr(module, "memcpy2d_async", _copy2d)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Nothing())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())


def _run_ranks(world_size: int, call_rank) -> None:
    """``call_rank(r)`` on one thread per rank; the first error raised."""
    import threading

    errors: list = []

    def one(r: int) -> None:
        try:
            call_rank(r)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_groups_are_consecutive_runs_in_arrival_order() -> None:
    from autotaxer.kernels.ag_gemm.experimental.ce_grouped import peer_groups

    for ws in (3, 4, 8):
        for rank in range(ws):
            for group in (1, 2, 4, 8):
                groups = peer_groups(rank, ws, group)
                flat = [p for lo, hi in groups for p in range(lo, hi + 1)]
                assert flat == list(peer_order(rank, ws, "rotated"))
                assert all(0 <= hi - lo < group for lo, hi in groups)
    assert peer_groups(2, 8, 2) == ((3, 4), (5, 6), (7, 7), (0, 1))
    assert peer_groups(2, 8, 8) == peer_runs(2, 8)


@pytest.mark.parametrize(
    ("world_size", "gather_dim", "group", "streams"),
    [(3, 0, 1, 2), (4, 0, 2, 1), (8, 0, 2, 4), (8, 0, 8, 8), (4, 1, 2, 2), (8, 1, 2, 4), (8, 1, 8, 1)],
)  # fmt: skip
def test_ce_grouped_gathers_and_multiplies_on_an_emulated_heap(
    monkeypatch, world_size: int, gather_dim: int, group: int, streams: int
) -> None:
    import autotaxer.kernels.ag_gemm.experimental.ce_grouped as grp

    _patch_transport(monkeypatch, grp)

    def make_plan(ch, m: int, k: int):
        return grp.make_grouped_plan(
            ch, m=m, k=k, gather_dim=gather_dim, elem=4, streams=streams, group=group, fp32_accumulate=False
        )

    _gathers_on_a_heap(world_size, gather_dim, make_plan, grp.ag_gemm_ce_grouped)


@pytest.mark.parametrize(
    ("world_size", "gather_dim", "streams", "chunks", "b_layout", "gemms"),
    [(2, 0, 1, 1, "kn", "caller"), (3, 0, 2, 2, "nk", "caller"), (4, 0, 1, 1, "nk", "caller"),
     (4, 0, 4, 2, "kn", "caller"), (8, 0, 2, 1, "nk", "caller"), (8, 0, 8, 4, "kn", "caller"),
     (4, 1, 2, 1, "nk", "caller"), (8, 1, 8, 2, "kn", "caller"),
     (2, 0, 1, 2, "nk", "lanes"), (3, 0, 1, 1, "kn", "lanes"), (4, 0, 2, 1, "nk", "lanes"),
     (4, 0, 3, 2, "kn", "lanes"), (8, 0, 2, 4, "nk", "lanes")],
)  # fmt: skip
def test_ce_pull_gathers_and_multiplies_on_an_emulated_heap(
    monkeypatch, world_size: int, gather_dim: int, streams: int, chunks: int, b_layout: str, gemms: str
) -> None:
    """Three calls of ``ce_pull`` on threads as ranks, the peers' GEMMs on the caller's stream or on the
    lanes: every output right, and after each run every ready flag taken and every ``done`` token handed
    back (a rank may publish its next shard)."""
    import autotaxer.kernels.ag_gemm.experimental.ce_pull as pull

    _patch_transport(monkeypatch, pull)
    monkeypatch.setattr(pull, "_new_events", lambda n: [_Nothing() for _ in range(n)])
    made: list = []

    def make_plan(ch, m: int, k: int):
        plan = pull.make_pull_plan(
            ch, m=m, k=k, gather_dim=gather_dim, elem=4, chunks=chunks, streams=streams,
            fp32_accumulate=False, gemms=gemms,
        )  # fmt: skip
        made.append((ch, plan))
        return plan

    handed: list = []

    def launch(ch, plan, inbox, a_shard, b, out) -> None:  # every call also hands the gathered A out
        import torch

        m, k = out.shape[0], b.shape[0]
        gathered = torch.full((m, k), float("nan"))
        pull.ag_gemm_ce_pull(ch, plan, inbox, a_shard, b, out, gathered=gathered)
        rows, ks = plan.base.rows, plan.base.k_shard
        r = ch.rank
        own = gathered[r * rows : (r + 1) * rows] if gather_dim == 0 else gathered[:, r * ks : (r + 1) * ks]
        assert torch.equal(own, a_shard), f"rank {r}: its own shard differs in the gathered A"
        err = ((gathered.double() @ b.double() - out.double()).norm() / out.double().norm()).item()
        handed.append(err)

    _gathers_on_a_heap(world_size, gather_dim, make_plan, launch, b_layout)
    assert len(handed) == 3 * world_size and max(handed) < 1e-5, (
        handed
    )  # the gathered A is what was multiplied
    assert get_op("ag_gemm").variants["ce_pull"].saves_for_backward()
    for ch, plan in made:
        assert len(plan.lanes) == min(streams, world_size - 1) and plan.gemms == gemms
        assert sorted(plan.events) == [(p, c) for p in sorted(plan.base.peers) for c in range(chunks)]
        assert ch.data.count_nonzero().item() == 0, f"rank {ch.rank}: a ready flag was never taken"
        assert ch.done.tolist() == [1] * world_size, f"rank {ch.rank}: done tokens {ch.done.tolist()}"


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_ce_pull_and_a_push_schedule_alternate_on_one_channel(monkeypatch, world_size: int) -> None:
    """Different keys of one model may be served ``ce_pull`` and a push schedule (``ce_fanout``, one chunk
    per peer) on the same channel: calls alternating between them stay right and leave every flag taken
    and every ``done`` token handed back."""
    import autotaxer.kernels.ag_gemm.experimental.ce_fanout as fan
    import autotaxer.kernels.ag_gemm.experimental.ce_pull as pull

    _patch_transport(monkeypatch, pull, fan)
    monkeypatch.setattr(pull, "_new_events", lambda n: [_Nothing() for _ in range(n)])
    made: list = []
    calls: dict = {}

    def make_plan(ch, m: int, k: int):
        kw = {"m": m, "k": k, "gather_dim": 0, "elem": 4, "chunks": 1, "streams": 2, "fp32_accumulate": False}
        plans = (pull.make_pull_plan(ch, **kw), fan.make_fanout_plan(ch, **kw, gemms="peer"))
        made.append(ch)
        return plans

    def launch(ch, plans, inbox, a_shard, b, out) -> None:
        turn = calls[ch.rank] = calls.get(ch.rank, -1) + 1
        if turn % 2 == 0:
            pull.ag_gemm_ce_pull(ch, plans[0], inbox, a_shard, b, out)
        else:
            fan.ag_gemm_ce_fanout(ch, plans[1], inbox, a_shard, b, out)

    _gathers_on_a_heap(world_size, 0, make_plan, launch)
    assert sorted(calls.values()) == [2] * world_size  # three calls each: pull, push, pull
    for ch in made:
        assert ch.data.count_nonzero().item() == 0 and ch.done.tolist() == [1] * world_size


def test_ce_pull_prunes_its_space_and_seeds_one_lane_first(monkeypatch) -> None:
    import autotaxer.kernels.common.signal as sig

    monkeypatch.setattr(sig, "memop_available", lambda: None)  # as on an NVIDIA GPU
    v = get_op("ag_gemm").variants["ce_pull"]
    ok = {"streams": 2, "signal": "memop", "chunks": 1, "accumulate": "out"}
    assert v.check(_key(4, 0), H200, ok) is None and v.experimental
    assert "at least 2 ranks" in v.check(_key(1, 0), H200, ok)
    assert "already gives each its own" in v.check(_key(2, 0), H200, {**ok, "streams": 2})
    assert "accumulate" in v.check(_key(4, 0), H200, {**ok, "accumulate": "fp32"})
    assert v.check(_key(4, 1), H200, {**ok, "accumulate": "fp32"}) is None
    assert "missing" in v.check(_key(4, 0), H200, {"streams": 1})
    lanes = {**ok, "gemms": "lanes"}  # torch's fused op's schedule: gather_dim=0 only
    assert v.check(_key(4, 0), H200, lanes) is None
    assert "gather_dim=0" in v.check(_key(4, 1), H200, lanes)
    assert "'caller' or 'lanes'" in v.check(_key(4, 0), H200, {**ok, "gemms": "peer"})
    assert v.space_of(_key(4, 1))["gemms"] == ("caller",) and "lanes" in v.space_of(_key(4, 0))["gemms"]
    import autotaxer.kernels.ag_gemm.experimental.ce_pull as pull

    with pytest.raises(ValueError, match="gather_dim=0"):
        kw = {"m": 64, "k": 64, "elem": 2, "chunks": 1, "streams": 2, "fp32_accumulate": False}
        pull.make_pull_plan(_FakeChannel(rank=0, world_size=4), gather_dim=1, gemms="lanes", **kw)
    for ws in (2, 4, 8):
        seeds = v.seeds_of(_key(ws, 0))
        assert seeds[0]["streams"] == 1 and all(v.check(_key(ws, 0), H200, s) is None for s in seeds)
        assert len({(s["streams"], s["gemms"]) for s in seeds}) == len(seeds)
        assert seeds[-1]["gemms"] == "lanes" and seeds[-1]["streams"] == min(2, ws - 1)
        assert all(s["gemms"] == "caller" for s in v.seeds_of(_key(ws, 1)))
    assert not get_op("ag_gemm").in_default_space("ce_pull", 8)  # opt-in


@pytest.mark.parametrize(
    ("world_size", "scatter_dim", "streams", "b_layout"),
    [(2, 0, 1, "kn"), (3, 1, 2, "nk"), (4, 0, 2, "nk"), (8, 0, 4, "kn"), (8, 1, 8, "kn")],
)  # fmt: skip
def test_gemm_rs_copy_engine_reduces_on_an_emulated_heap(
    monkeypatch, world_size: int, scatter_dim: int, streams: int, b_layout: str
) -> None:
    import autotaxer.kernels.gemm_rs.copy_engine as rsce
    import torch

    _patch_transport(monkeypatch, rsce)
    ws = world_size
    m, n, ks = (8 * ws, 24, 16) if scatter_dim == 0 else (24, 8 * ws, 16)
    mo, no = (m // ws, n) if scatter_dim == 0 else (m, n // ws)
    ranks = _heap_ranks(ws, ws * mo * no * 4)
    plans = [
        rsce.make_rs_plan(ch, m=m, n=n, scatter_dim=scatter_dim, elem=4, streams=streams) for ch in ranks
    ]
    assert all(len(p.lanes) == min(streams, ws - 1) for p in plans)
    staging = [torch.empty(ws - 1, mo, no) for _ in ranks]
    for call in range(3):
        gen = torch.Generator().manual_seed(call)
        a = [torch.randn(m, ks, generator=gen) for _ in ranks]
        b = [torch.randn(ks, n, generator=gen) if b_layout == "kn" else torch.randn(n, ks, generator=gen).t()
             for _ in ranks]  # fmt: skip
        outs = [torch.full((mo, no), float("nan")) for _ in ranks]

        def rank_call(r: int, a=a, b=b, outs=outs) -> None:
            inbox = ranks[r].arena(0).view(torch.float32)
            ready = [_Nothing() for _ in range(ws - 1)]
            rsce.gemm_rs_ce(ranks[r], plans[r], inbox, staging[r], ready, a[r], b[r], outs[r])

        _run_ranks(ws, rank_call)
        full = sum(x.double() @ y.double() for x, y in zip(a, b, strict=True))
        for r, out in enumerate(outs):
            ref = full.chunk(ws, dim=scatter_dim)[r]
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"call {call} rank {r}: relative error {err}"


def test_ce_grouped_and_gemm_rs_copy_engine_prune_their_spaces(monkeypatch) -> None:
    import autotaxer.kernels.common.signal as sig

    monkeypatch.setattr(sig, "memop_available", lambda: None)  # as on an NVIDIA GPU
    v = get_op("ag_gemm").variants["ce_grouped"]
    ok = {"streams": 4, "group": 2, "signal": "memop", "accumulate": "out"}
    assert v.check(_key(8, 0), H200, ok) is None
    assert "at least 3 ranks" in v.check(_key(2, 0), H200, ok)
    assert "already covers them all" in v.check(_key(4, 0), H200, {**ok, "group": 8})
    assert "accumulate" in v.check(_key(8, 0), H200, {**ok, "accumulate": "fp32"})
    for ws, gd in ((3, 0), (4, 0), (4, 1), (8, 0), (8, 1)):  # (K = 8192 does not split over 3 ranks)
        key = _key(ws, gd)
        seeds = v.seed_configs(key, H200)
        assert seeds and all(v.check(key, H200, s) is None for s in seeds), seeds
        space = v.search_space(key, H200)
        assert all(s[f] in space[f] for s in seeds for f in space)
    rs = get_op("gemm_rs").variants["copy_engine"]
    for ws in (2, 4, 8):
        key = ProblemKey.make("gemm_rs", "nvidia-h200", ws, "bf16", {"M": 1024, "N": 8192, "K": 8192},
                              {"scatter_dim": 0})  # fmt: skip
        space = rs.search_space(key, H200)
        valid = [p for p in iter_grid(space) if rs.check(key, H200, p) is None]
        assert {p["streams"] for p in valid} == {s for s in (1, 2, 4, 8) if s == 1 or s // 2 < ws - 1}
        assert all(s in valid for s in rs.seed_configs(key, H200))
    assert "at least 2 ranks" in rs.check(
        ProblemKey.make("gemm_rs", "nvidia-h200", 1, "bf16", {"M": 64, "N": 64, "K": 64}, {"scatter_dim": 0}),
        H200, {"streams": 1, "signal": "triton"},
    )  # fmt: skip


def test_copy_engine_schedules_join_the_default_space_from_three_ranks(monkeypatch) -> None:
    from autotaxer.tuner.study import SearchSpace

    op = get_op("ag_gemm")
    assert op.in_default_space("push", 2) and op.in_default_space("copy_engine", 8)
    assert not op.in_default_space("ce_fanout", 2) and not op.in_default_space("ce_grouped", 2)
    assert op.in_default_space("ce_fanout", 3) and op.in_default_space("ce_grouped", 8)
    assert not op.in_default_space("push_ws", 8)  # opt-in at every size
    monkeypatch.setattr(type(op), "available_variants", lambda self, target: dict(self.variants))
    at = {ws: SearchSpace.build(op, _key(ws, 0), H200, None).names for ws in (2, 8)}
    assert "ce_grouped" not in at[2] and {"ce_fanout", "ce_grouped"} <= set(at[8])
    assert "push_ws" not in at[8]
    named = SearchSpace.build(op, _key(8, 0), H200, ("push",)).names  # --variants still decides alone
    assert "ce_grouped" not in named and "push" in named
