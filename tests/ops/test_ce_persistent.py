"""``ce_persistent`` (issue 47): the copy engine's transfer and one persistent GEMM waiting per tile on the
chunk flags. On CPU: the plan (chunks, send order, lanes, grid), the variant's pruning, space and seeds;
under Triton's interpreter, 2, 4 and 8 emulated ranks (``autotaxer.testing.ce_persistent``: host
transport, the real GEMM kernel; both layouts of B, both gather dims, two calls with both outputs kept,
outputs and inboxes NaN-poisoned), a withheld chunk the GEMM must give up on exactly, and peers that
never signal. The GPUs run it in ``tests/ops/test_ag_gemm_gpu.py`` (world size 2 and 4)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import replace

import pytest

from autotaxer._problem import ProblemKey
from autotaxer._target import Target
from autotaxer.ops import get_op, iter_grid

H200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")
A100 = Target(gpu_model="nvidia-a100-sxm4-80gb", arch="sm_80", num_sms=108, device_type="cuda")


def _key(ws: int, gd: int, m: int = 4096, b_layout: str = "kn", n: int = 8192, k: int = 8192) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", {"M": m, "N": n, "K": k},
                           {"gather_dim": gd, "b_layout": b_layout})  # fmt: skip


# -- the plan, on a stand-in channel (addresses only) -------------------------------------------------


class _Buf:
    def __init__(self, addr: int) -> None:
        self.addr = addr

    def data_ptr(self) -> int:
        return self.addr


class _FakeChannel:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.data, self.done = _Buf(0x1000), _Buf(0x2000)

    def arena(self, nbytes: int) -> _Buf:
        return _Buf(0x10000)

    def remote(self, ptr: int, peer: int) -> int:
        return ptr + (peer << 40)


@pytest.mark.parametrize(
    ("rows", "chunks", "block_m"),
    [(1024, 4, 128), (1000, 3, 128), (64, 4, 128), (4096, 16, 128), (32, 1, 64), (384, 2, 128)],
)
def test_chunks_are_uniform_and_cover_the_shard(rows: int, chunks: int, block_m: int) -> None:
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import chunk_width, uniform_rows

    width = chunk_width(rows, chunks, block_m)
    cut = uniform_rows(rows, width)
    assert [f for f, _ in cut] == list(range(0, rows, width))  # the device's index is row // width
    assert sum(n for _, n in cut) == rows and all(0 < n <= width for _, n in cut)
    assert len(cut) <= chunks
    if rows % block_m == 0:
        assert width % block_m == 0  # a tile waits on one chunk


def test_plan_sends_to_the_peer_that_reads_first_and_reserves_an_sm() -> None:
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import (
        RESERVED_SMS,
        CePersistentConfig,
        make_persistent_plan,
    )

    config = CePersistentConfig(block_m=128, block_n=256, chunks=4, streams=2)
    plan = make_persistent_plan(_FakeChannel(2, 8), m=8192, n=1024, k=8192, gather_dim=0, elem=2,
                                config=config, num_sms=132)  # fmt: skip
    assert plan.base.peers == (1, 0, 7, 6, 5, 4, 3)  # rank r-1 reads this shard first (rank-rotated tiles)
    assert plan.sends[:5] == ((1, 0), (1, 1), (1, 2), (1, 3), (0, 0))  # gather_dim=0: peer-major
    assert plan.lanes == ((1, 7, 5, 3), (0, 6, 4)) and plan.row_width == 256 and plan.chunks == 4
    assert plan.programs == min(132 - RESERVED_SMS, 64 * 4) == 131
    small = make_persistent_plan(_FakeChannel(0, 4), m=256, n=256, k=64, gather_dim=0, elem=2, config=config,
                                 num_sms=132)  # fmt: skip
    assert small.programs == 2  # fewer tiles than SMs
    gd1 = make_persistent_plan(_FakeChannel(0, 4), m=1024, n=1024, k=8192, gather_dim=1, elem=2,
                               config=config, num_sms=132)  # fmt: skip
    assert gd1.sends[:3] == (
        (3, 0),
        (2, 0),
        (1, 0),
    )  # gather_dim=1: chunk-major (every tile needs every peer)
    assert gd1.base.k_shard == 2048 and gd1.base.rows == 1024
    dealt = make_persistent_plan(_FakeChannel(2, 8), m=8192, n=1024, k=8192, gather_dim=0, elem=2,
                                 config=replace(config, order=1), num_sms=132)  # fmt: skip
    assert dealt.sends[:3] == ((1, 0), (0, 0), (7, 0))  # order 1: chunk 0 to every peer first
    with pytest.raises(ValueError, match="evenly"):  # 8 row tiles a shard, groups of 3
        make_persistent_plan(_FakeChannel(2, 8), m=8192, n=1024, k=8192, gather_dim=0, elem=2,
                             config=replace(config, order=1, group_m=3), num_sms=132)  # fmt: skip
    with pytest.raises(ValueError, match="num_sms"):
        make_persistent_plan(_FakeChannel(0, 2), m=256, n=256, k=64, gather_dim=0, elem=2, config=config,
                             num_sms=1)  # fmt: skip
    with pytest.raises(ValueError, match="chunks"):
        CePersistentConfig(chunks=17).validate()


# -- the variant: registration, pruning, space, seeds -------------------------------------------------


def test_registered_as_opt_in() -> None:
    op = get_op("ag_gemm")
    v = op.variants["ce_persistent"]
    assert v.experimental and not any(op.in_default_space("ce_persistent", ws) for ws in (2, 4, 8))
    assert "ce_persistent" in op.tied_to_size  # a Triton GEMM: its tiles hold at the M they were tuned at
    assert v.unavailable_reason(Target("cpu", "cpu", 4, device_type="cpu")) is not None


def _as_on_a_gpu(monkeypatch) -> None:
    """Stream memops available, as on an NVIDIA GPU (the check asks the driver)."""
    import autotaxer.kernels.common.signal as sig

    monkeypatch.setattr(sig, "memop_available", lambda: None)


def test_check_prunes_what_cannot_run_or_repeats_another_point(monkeypatch) -> None:
    v = get_op("ag_gemm").variants["ce_persistent"]
    ok = {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3,
          "chunks": 4, "streams": 1, "tma": 1, "signal": "triton"}  # fmt: skip
    assert v.check(_key(4, 0), H200, ok) is None and v.check(_key(2, 1, b_layout="nk"), H200, ok) is None
    assert v.check(_key(4, 0), H200, {**ok, "poll": 1}) is None  # without poll: 0, as tuned before it
    assert "poll: must be in 0..2" in v.check(_key(4, 0), H200, {**ok, "poll": 5})
    assert "signal=memop" in v.check(_key(4, 0), H200, {**ok, "signal": "memop"})  # no driver here
    assert "unknown back end" in v.check(_key(4, 0), H200, {**ok, "signal": "nccl"})
    _as_on_a_gpu(monkeypatch)
    assert v.check(_key(4, 0), H200, {**ok, "signal": "memop"}) is None
    assert "missing" in v.check(_key(4, 0), H200, {"chunks": 4})
    assert "at least 2 ranks" in v.check(_key(1, 0), H200, ok)
    assert "num_warps" in v.check(_key(4, 0), H200, {**ok, "num_warps": 4})  # 128x256 needs 8 warps
    assert "num_stages" in v.check(_key(4, 0), H200, {**ok, "block_k": 128, "num_stages": 5})  # shared memory
    assert "give 1" in v.check(_key(8, 0, m=1024), H200, {**ok, "chunks": 4})  # 128-row shards: one tile row
    assert "already gives each its own" in v.check(_key(4, 0), H200, {**ok, "streams": 8})
    assert "straddle" in v.check(_key(4, 0, m=256), H200, ok)  # 64-row shards, 128-row TMA tiles
    assert v.check(_key(4, 0, m=256), H200, {**ok, "tma": 0}) is None
    assert "sm_90" in v.check(_key(4, 0), A100, ok)
    fp32 = ProblemKey.make(
        "ag_gemm", "nvidia-h200", 4, "fp32", {"M": 4096, "N": 64, "K": 64}, {"gather_dim": 0}
    )
    assert "dtype" in v.check(fp32, H200, ok)
    assert "divisible" in v.check(_key(4, 1, k=8194), H200, ok)


@pytest.mark.parametrize("ws", [2, 4, 8])
@pytest.mark.parametrize("gd", [0, 1])
def test_seeds_are_valid_cublas_class_tilings_in_the_space(ws: int, gd: int, monkeypatch) -> None:
    _as_on_a_gpu(monkeypatch)
    v = get_op("ag_gemm").variants["ce_persistent"]
    for m in (256, 1024, 4096, 16384):
        for b_layout in ("kn", "nk"):
            key = _key(ws, gd, m=m, b_layout=b_layout)
            seeds = v.seed_configs(key, H200)
            space = v.search_space(key, H200)
            assert seeds, key.text
            assert all(v.check(key, H200, s) is None for s in seeds)
            assert all(s[f] in space[f] for s in seeds for f in space) and all(
                set(s) == set(space) for s in seeds
            )
            assert {(s["block_m"], s["block_n"], s["block_k"]) for s in seeds} == {
                (128, 256, 64),
                (128, 128, 64),
            }
            if m >= 4096:
                assert seeds[0]["tma"] == 1 and seeds[0]["chunks"] == 4 and seeds[0]["signal"] == "triton"
            assert {s["signal"] for s in seeds} == {"triton", "memop"}
    # every valid point is a different schedule: chunks, streams and TMA are never repeats of another
    key = _key(ws, gd, m=1024)
    valid = [p for p in iter_grid(v.search_space(key, H200)) if v.check(key, H200, p) is None]
    assert valid and {min(p["streams"], ws - 1) for p in valid} == {
        s for s in (1, 2, 4, ws - 1) if s <= ws - 1
    }


# -- emulated ranks under Triton's interpreter ---------------------------------------------------------

_PRELUDE = textwrap.dedent(
    """
    import torch

    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import CePersistentConfig
    from autotaxer.testing import ce_persistent as emu


    def cfg(**kw):
        base = dict(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, chunks=2,
                    streams=1, tma=0)
        return CePersistentConfig(**{**base, **kw})
    """
)


@pytest.fixture
def interpret(interpreter_worker) -> Callable[..., str]:
    """``interpret(body, timeout=...)``: what ``body`` (after the prelude) printed in the interpreter."""
    return lambda body, timeout=300.0: interpreter_worker.run(
        _PRELUDE + textwrap.dedent(body), timeout=timeout
    )


@pytest.mark.emulated
@pytest.mark.parametrize("ws", [2, 4, pytest.param(8, marks=pytest.mark.slow)], ids=lambda ws: f"ws{ws}")
def test_emulated_ranks_both_layouts_two_calls(ws: int, interpret: Callable[..., str]) -> None:
    """gather_dim=0: 5-row shards straddle 16-row tiles (tiles wait on two ranks), K=40 is not a multiple
    of BLOCK_K; gather_dim=1: 8-column K-slices are half a K block; both B layouts; lanes up to one per
    peer; both flag back ends (epochs, memop tokens); fp16 once (bf16 is the GPUs' dtype: the interpreter
    computes in numpy)."""
    lanes = {2: 1, 4: 2, 8: 8}[ws]
    out = interpret(
        f"""
        print(emu.check_ce_persistent({ws}, 0, {5 * ws}, 40, 40, cfg(chunks=2, streams={lanes})))
        print(emu.check_ce_persistent({ws}, 0, {5 * ws}, 40, 40, cfg(chunks=1), b_layout="nk",
                                      signal="memop"))
        print(emu.check_ce_persistent({ws}, 1, 20, 40, {8 * ws}, cfg(streams={lanes}), b_layout="nk"))
        print(emu.check_ce_persistent({ws}, 1, 20, 40, {8 * ws}, cfg(chunks=1), dtype=torch.float16,
                                      signal="memop"))
        """
    )
    assert out.count("OK") == 4 and out.count(" memop ") == 2, out


@pytest.mark.emulated
def test_emulated_ranks_tma_consumer(interpret: Callable[..., str]) -> None:
    """``tma=1``: the TMA consumer where shards are whole row tiles (gather_dim=0) and rows 16 bytes."""
    out = interpret(
        """
        print(emu.check_ce_persistent(4, 0, 128, 64, 32, cfg(tma=1, chunks=2, streams=4)))
        print(emu.check_ce_persistent(4, 1, 32, 64, 64, cfg(tma=1), b_layout="nk"))
        """
    )
    assert out.count("OK") == 2 and out.count("tma=True") == 2, out


@pytest.mark.emulated
def test_order_1_takes_every_tile_once_chunk_by_chunk(interpret: Callable[..., str]) -> None:
    """``order=1`` deals the peers' tile groups in turn (a bijection only where groups cut a shard evenly):
    every output row right at 3, 4 and 8 ranks, groups of one and two tile rows, both consumers, both
    flag back ends (a missed or doubled tile leaves NaN or a wrong sum)."""
    out = interpret(
        """
        print(emu.check_ce_persistent(4, 0, 256, 32, 32, cfg(order=1, chunks=4, group_m=1, streams=4)))
        print(emu.check_ce_persistent(4, 0, 256, 32, 32, cfg(order=1, chunks=2, group_m=2, tma=1),
                                      b_layout="nk", signal="memop"))
        print(emu.check_ce_persistent(3, 0, 96, 32, 32, cfg(order=1, chunks=2, group_m=1, streams=2)))
        print(emu.check_ce_persistent(8, 0, 256, 32, 32, cfg(order=1, chunks=2, group_m=1, streams=8),
                                      signal="memop"))
        """,
        timeout=600.0,
    )
    assert out.count("OK") == 4 and out.count("tma=True") == 1, out


def test_order_1_is_checked() -> None:
    """``order=1`` only where it deals whole groups of whole row tiles, at gather_dim=0, with chunks."""
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    with pytest.raises(ValueError, match="order: must be 0 or 1"):
        cp.CePersistentConfig(order=2).validate()
    config = cp.CePersistentConfig(block_m=128, group_m=8, chunks=4, order=1)
    assert cp.chunk_major_error(1024, config) is None  # 8 row tiles, one group
    assert "whole row tiles" in cp.chunk_major_error(1000, config)
    assert cp.chunk_major_error(768, config) is None  # 6 row tiles: a group is at most a shard
    assert "evenly" in cp.chunk_major_error(768, cp.CePersistentConfig(block_m=128, group_m=4, order=1))


@pytest.mark.emulated
def test_a_withheld_chunk_is_the_only_wait_that_gives_up(interpret: Callable[..., str]) -> None:
    """Every flag up but one chunk's: the GEMM gives up on exactly that flag (peer, chunk) and every other
    row is right, so each tile waits on the chunks of its own rows (and the local rows on none)."""
    out = interpret(
        """
        print(emu.check_withheld_chunk(4, 128, 40, 24, cfg(chunks=2, streams=2), peer=2, chunk=1))
        print(emu.check_withheld_chunk(8, 256, 32, 16, cfg(chunks=2), peer=7, chunk=0))
        """
    )
    assert out.count("OK") == 2, out


@pytest.mark.emulated
@pytest.mark.parametrize("ws", [2, 4])
def test_peers_that_never_signal_end_in_the_named_error(ws: int, interpret: Callable[..., str]) -> None:
    out = interpret(
        f"""
        import json

        exc = emu.never_signal({ws}, timeout_s=0.3)
        f = exc.failure
        print(json.dumps([f.site.op, f.site.variant, f.site.rank, f.peer, f.site.key, str(exc)]))
        """
    )
    op, variant, rank, peer, key, message = json.loads(out.strip().splitlines()[-1])
    assert (op, variant, rank) == ("ag_gemm", "ce_persistent", 0) and 1 <= peer < ws, out
    assert (
        f"ag_gemm ce_persistent at {key}" in message and "never signalled" in message and "0.3 s" in message
    )


@pytest.mark.emulated
def test_a_tile_wait_reads_the_bound_once(interpret: Callable[..., str]) -> None:
    """Issue 47's stall: the GEMM's waits read the watch slot's bound (pinned host memory) once per wait,
    not on every poll. A bound raised on the host 10 ms into a wait is not seen by the default (``once``:
    it gives up at the bound it read), and is by ``every`` (the shared consumer's waits, kept for the A/B
    run on GPUs), whose late chunk then lands and is used. Fails on the code before the fix (it read every
    poll: no wait gave up)."""
    out = interpret(
        """
        print(emu.check_bound_read_once("once"))
        print(emu.check_bound_read_once("every"))
        """
    )
    assert "OK bound reads=once: 1 gave up" in out and "OK bound reads=every: 0 gave up" in out, out


@pytest.mark.emulated
def test_the_default_wait_reads_no_bound_before_ten_ms(interpret: Callable[..., str]) -> None:
    """Issue 47's stall after the first fix: read 50 us into a wait, the bound still cost every waiting
    warp a PCIe read a call, one after another (hundreds of us on one GPU). The default ``late`` waits read
    it only after 10 ms: with a 5 ms bound never raised, ``once`` gives up at 5 ms and ``late`` not before
    10; with the bound raised at 10 ms, ``late`` sees the raised one, so the late chunk is used. Fails on
    the ``once`` waits as the default (the first check)."""
    out = interpret(
        """
        from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
        print("default", cp.bound_reads())
        print(emu.check_bound_read_once("once", bound_ms=5, raise_ms=None))
        print(emu.check_bound_read_once("late", bound_ms=5, raise_ms=None))
        print(emu.check_bound_read_once("late"))
        """
    )
    assert "default late" in out, out
    assert "OK bound reads=once: 1 gave up" in out and out.count("OK bound reads=late") == 2, out
    assert "OK bound reads=late: 0 gave up" in out, out


def test_bound_reads_setting_is_checked(monkeypatch) -> None:
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    monkeypatch.delenv(cp.BOUND_READS_ENV, raising=False)
    assert cp.bound_reads() == "late" and cp.kernel_for("late") is cp.KERNEL_LATE
    assert cp.kernel_for("once") is cp.KERNEL and cp.kernel_for("every") is cp.KERNEL
    assert cp.KERNEL_LATE.arg_names == cp.KERNEL.arg_names
    monkeypatch.setenv(cp.BOUND_READS_ENV, "once")
    assert cp.bound_reads() == "once"
    monkeypatch.setenv(cp.BOUND_READS_ENV, "every")
    assert cp.bound_reads() == "every"
    monkeypatch.setenv(cp.BOUND_READS_ENV, "sometimes")
    with pytest.raises(ValueError, match=cp.BOUND_READS_ENV):
        cp.bound_reads()


def test_poll_is_checked_and_its_default_is_the_first_kernel() -> None:
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    assert cp.CePersistentConfig().poll == 0 and cp.POLLS[0] == "atomic"
    cp.CePersistentConfig(poll=2).validate()
    with pytest.raises(ValueError, match="poll: must be in 0..2"):
        cp.CePersistentConfig(poll=3).validate()


def test_the_second_seed_is_the_first_reading_by_load() -> None:
    """Seeds run first in a bench or a tune: the A/B of the tiles' read is in every run of the variant."""
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op

    key = ProblemKey.make(
        "ag_gemm", "nvidia-h200", 4, "bf16", {"M": 1024, "N": 2560, "K": 8192}, {"gather_dim": 0}
    )
    seeds = get_op("ag_gemm").variants["ce_persistent"].seeds_of(key)
    assert seeds[0]["poll"] == 0 and seeds[1] == {**seeds[0], "poll": 1}
    assert seeds[2] == {**seeds[1], "group_m": 1}  # 256-row shards in 2 chunks of one tile row
    assert seeds[3] == {**seeds[2], "streams": 4, "order": 1}  # a side stream a peer, chunk by chunk
    assert all(s["poll"] == 0 and s["order"] == 0 for s in seeds[4:])


@pytest.mark.parametrize("ws", [2, 4, 8])
def test_a_seed_groups_its_tiles_inside_one_chunk(ws: int) -> None:
    """Where the first seed's tile groups span several chunks of a shard (its first tiles then wait for
    the shard's last chunk), the third seed is it with groups of whole tile rows inside one chunk; at
    gather_dim=1 (chunks cut K) or one chunk a shard, no such seed."""
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import chunk_width

    from autotaxer import ProblemKey
    from autotaxer.ops import get_op

    variant = get_op("ag_gemm").variants["ce_persistent"]
    for m in (256, 1024, 4096, 16384):
        for gd in (0, 1):
            key = ProblemKey.make(
                "ag_gemm", "nvidia-h200", ws, "bf16", {"M": m, "N": 2560, "K": 8192}, {"gather_dim": gd}
            )
            seeds = variant.seeds_of(key)
            first = seeds[0]
            rows, bm = m // ws, first["block_m"]
            width = chunk_width(rows, first["chunks"], bm)
            group = min(first["group_m"], max(rows // bm, 1))  # the kernel keeps a group inside a shard
            spans = gd == 0 and first["chunks"] > 1 and width >= bm and group * bm > width
            if not spans:
                assert all(s["group_m"] == first["group_m"] for s in seeds), key.text
                continue
            grouped = seeds[2]
            assert grouped == {**seeds[1], "group_m": grouped["group_m"]}, key.text
            rows = grouped["group_m"] * grouped["block_m"]
            assert rows <= width and width % rows == 0, key.text
            assert grouped["group_m"] in variant.search_space(key, None)["group_m"]


@pytest.mark.emulated
@pytest.mark.parametrize("poll", ["load", "sleep"])
def test_every_poll_mode_runs_the_protocol(poll: str, interpret: Callable[..., str]) -> None:
    """``poll`` 1 and 2 (under the interpreter: the atomic read, as on AMD) through the same consumer: both
    layouts and flag back ends at 4 ranks, the launch built with that read."""
    mode = ("atomic", "load", "sleep").index(poll)
    out = interpret(
        f"""
        print(emu.check_ce_persistent(4, 0, 20, 40, 40, cfg(chunks=2, streams=2, poll={mode})))
        print(emu.check_ce_persistent(4, 1, 20, 40, 32, cfg(poll={mode}), b_layout="nk", signal="memop"))
        """
    )
    assert out.count("OK") == 2, out


def test_the_poll_modes_consumers_differ_only_in_their_read() -> None:
    """Each mode's consumers wait through a spin whose ``_poll`` is that mode's; ``push``'s keep theirs."""
    from autotaxer.kernels.ag_gemm import consume, protocol
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    for consumer, poll in (
        (cp.consume_tiles_load, cp._poll_load),
        (cp.consume_tiles_tma_sleep, cp._poll_sleep),
    ):
        wait = consumer.fn.__globals__["wait_segment"]
        spin = wait.fn.__globals__["wait_rows"].fn.__globals__["spin_until"]
        assert (
            spin.fn.__globals__["_poll"] is poll and spin.fn.__code__ is cp.spin_until_read_once.fn.__code__
        )
    assert consume.consume_tiles.fn.__globals__["wait_segment"] is protocol.wait_segment


def test_the_read_once_consumers_leave_pushs_untouched() -> None:
    """The recompiled consumers wait through ``wait_segment_read_once``; ``push``'s keep the shared wait."""
    from autotaxer.kernels.ag_gemm import consume, consume_tma, protocol
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    for shared, mine in ((consume.consume_tiles, cp.consume_tiles_read_once),
                         (consume_tma.consume_tiles_tma, cp.consume_tiles_tma_read_once)):  # fmt: skip
        assert shared.fn.__globals__["wait_segment"] is protocol.wait_segment
        assert mine.fn.__globals__["wait_segment"] is cp.wait_segment_read_once
        assert mine.fn.__code__ is shared.fn.__code__  # the same consumer, line for line
    with pytest.raises(NameError, match="no global 'wait_segmnt'"):
        cp.with_globals(consume.consume_tiles, wait_segmnt=cp.wait_segment_read_once)


def test_order_1_kernels_take_their_tiles_from_the_chunk_major_order_only() -> None:
    """``kernel_for(reads, 1, ws)``: every consumer it calls maps tiles by the chunk-major order at that
    world size, keeping the wait of ``reads``; order 0's kernels and ``push``'s consumer keep the shared
    ``tile_at``; one kernel per (reads, world size)."""
    from autotaxer.kernels.ag_gemm import consume
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    for reads in cp.BOUND_READS:
        dealt = cp.kernel_for(reads, 1, 4)
        assert dealt is cp.kernel_for(reads, 1, 4) and dealt is not cp.kernel_for(reads, 1, 8)
        plain = cp.kernel_for(reads)
        for name in cp._CONSUMERS:
            consumer = dealt.fn.__globals__[name]
            tile_at = consumer.fn.__globals__["tile_at"]
            assert tile_at.fn.__code__ is cp.tile_at_chunk_major.fn.__code__, (reads, name)
            assert tile_at.fn.__globals__["ORDER_WORLD"] == 4
            same_wait = plain.fn.__globals__[name].fn.__globals__["wait_segment"]
            assert consumer.fn.__globals__["wait_segment"] is same_wait, (reads, name)
            assert plain.fn.__globals__[name].fn.__globals__["tile_at"] is consume.tile_at
    with pytest.raises(ValueError, match="order"):
        cp.kernel_for("late", 2, 4)
