"""Waits on peers that give up: the kernels' bounded waits on emulated ranks (Triton's interpreter, CPU)
and the host side that names them (the watch board, ``autotaxer.check``, dispatch, the tuner's worker).

The ``never_signal`` test runs rank 0 of two emulated ranks whose peer never runs: every kind of wait
(the fused ag_gemm consumer by push and pull's fetch, gemm_rs's reduce, flash decode's consumers, the
copy-engine flag wait) gives up after the bound and ``autotaxer.check`` raises ``PeerTimeoutError``
naming the op, the variant, the key and rank 1."""

from __future__ import annotations

import json
import textwrap

import pytest

_NEVER_SIGNAL = textwrap.dedent(
    """
    import json, time
    from autotaxer.tools.emulated_ranks import never_signal, never_signal_kinds

    for kind in never_signal_kinds():
        t0 = time.monotonic()
        exc = never_signal(kind, timeout_s=0.3)
        f = exc.failure
        print(json.dumps(dict(kind=kind, message=str(exc), op=f.site.op, variant=f.site.variant,
                              key=f.site.key, peer=f.peer, rank=f.site.rank, seconds=time.monotonic() - t0)))
    """
)


@pytest.mark.emulated
def test_never_signal_emulated_ranks_end_with_the_named_error(interpreter_worker) -> None:
    out = interpreter_worker.run(_NEVER_SIGNAL, timeout=600)  # the tests' interpreter process
    found = {r["kind"]: r for r in map(json.loads, out.splitlines())}
    assert set(found) == {"push", "pull", "gemm_rs", "flash_decode", "signal"}
    expected = {"push": ("ag_gemm", "push"), "pull": ("ag_gemm", "pull"), "gemm_rs": ("gemm_rs", "push"),
                "flash_decode": ("flash_decode", "fused"), "signal": ("ag_gemm", "copy_engine")}  # fmt: skip
    for kind, r in found.items():
        assert (r["op"], r["variant"]) == expected[kind], r
        assert r["peer"] == 1 and r["rank"] == 0, r
        assert f"{r['op']} {r['variant']} at {r['key']}" in r["message"], r
        assert "rank 1, which never signalled" in r["message"] and "0.3 s" in r["message"], r


def _board():
    from autotaxer.kernels.common.watch import WatchBoard

    from autotaxer.ops._peer_wait import PeerWatch

    board = WatchBoard("cpu", slots=4)
    return board, PeerWatch(board)


def _site(variant: str = "push"):
    from autotaxer.ops._peer_wait import Site

    return Site("ag_gemm", variant, "ag_gemm|cpu|ws2|fp32|M=24,N=40,K=40|gather_dim=0", 0, 2)


def _give_up(board, index: int, peer: int, flag: int) -> None:
    """What a kernel's ``give_up`` writes into slot ``index`` and the alarm."""
    from autotaxer.kernels.common import watch as w

    base = w.SLOT_WORDS * (index + 1)
    for word, value in ((w.PEER, peer), (w.INDEX, flag), (w.EXPECTED, 3), (w.SEEN, 2), (w.WRITTEN, 1)):
        board.view[base + word] = value
    board.view[base + w.GAVE_UP] += 1
    board.view[0] += 1


def test_watch_names_the_site_and_peer_once_and_marks_it_failed() -> None:
    from autotaxer.ops._peer_wait import PeerTimeoutError

    board, watch = _board()
    slot = watch.open(_site(), 2.0, first_call_s=2.0)
    other = watch.open(_site("pull"), 2.0)
    watch.poll()  # nothing gave up
    _give_up(board, slot.index, peer=1, flag=7)
    assert watch.view[0] != watch.expect  # what dispatch's hot path compares
    with pytest.raises(PeerTimeoutError) as info:
        watch.poll()
    text = str(info.value)
    assert "ag_gemm push at ag_gemm|cpu|ws2" in text and "rank 0 of 2 waited 2 s for rank 1" in text
    assert "flag 7: waited for 3, read 2" in text and "1 wait(s) gave up" in text
    assert info.value.failure.peer == 1 and info.value.failure.site.variant == "push"
    assert watch.is_failed("ag_gemm", "push", _site().key) and not watch.is_failed(
        "ag_gemm", "pull", _site().key
    )
    watch.poll()  # reported once
    assert watch.view[0] == watch.expect
    del other


def test_check_of_cuda_without_index_reads_the_current_device_board(monkeypatch) -> None:
    """``check("cuda")`` (what ``never_signal(device="cuda")`` passes) polls the board of ``cuda:<current>``:
    ``torch.device("cuda") != torch.device("cuda", 0)``, and comparing them unnormalised read no record, so
    a kernel that gave up on one GPU ended "without giving up". A board stands in for the GPU's here."""
    import torch

    from autotaxer.ops import _peer_wait
    from autotaxer.ops._peer_wait import PeerTimeoutError, check

    board, watch = _board()
    board.device = torch.device("cuda", 0)
    monkeypatch.setattr(_peer_wait, "_WATCHES", {"cuda:0": watch})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    slot = watch.open(_site(), 0.5)
    _give_up(board, slot.index, peer=1, flag=4)
    check("cuda:1")  # another device's board: not read
    for device in ("cuda", torch.device("cuda")):
        with pytest.raises(PeerTimeoutError, match="rank 1, which never signalled"):
            check(device)
        _give_up(board, slot.index, peer=1, flag=4)
    with pytest.raises(PeerTimeoutError):
        check("cuda:0")
    assert synced == [torch.device("cuda", i) for i in (1, 0, 0, 0)]


def test_slot_starts_with_the_first_call_bound_and_is_released_with_its_owner() -> None:
    from autotaxer.kernels.common import watch as w

    board, watch = _board()
    slot = watch.open(_site(), 0.5, first_call_s=30.0)
    bound = board.view[w.SLOT_WORDS * (slot.index + 1) + w.BOUND]
    assert bound == 30 * 10**9 and watch.expect == -1  # the hot path looks until the slot has its own bound
    watch.poll()
    assert board.view[w.SLOT_WORDS * (slot.index + 1) + w.BOUND] == 5 * 10**8 and watch.expect >= 0
    slots = [watch.open(_site(), 1.0) for _ in range(3)]
    with pytest.raises(RuntimeError, match="all 4 watch slots are in use"):
        watch.open(_site(), 1.0)
    del slots, slot
    import gc

    gc.collect()
    assert len([watch.open(_site(), 1.0) for _ in range(4)]) == 4


def test_the_wait_check_threshold_comes_from_the_environment(monkeypatch) -> None:
    """``$AUTOTAXER_WAIT_CHECK_AFTER_US`` (the shared waits' bound reads): 10 ms unless set, a
    whole number of µs when set, anything else refused naming the variable; the kernels' constexpr takes
    it at import (a fresh process)."""
    import os
    import subprocess
    import sys

    from autotaxer.kernels.common.watch import CHECK_AFTER_ENV, check_after_ns

    monkeypatch.delenv(CHECK_AFTER_ENV, raising=False)
    assert check_after_ns() == 10_000_000
    monkeypatch.setenv(CHECK_AFTER_ENV, "50")
    assert check_after_ns() == 50_000
    for bad in ("0", "-5", "1.5", "soon"):
        monkeypatch.setenv(CHECK_AFTER_ENV, bad)
        with pytest.raises(ValueError, match=CHECK_AFTER_ENV):
            check_after_ns()
    code = "from autotaxer.kernels.common import watch; print(watch.CHECK_AFTER_NS.value)"
    for value, want in (("", "10000000"), ("250", "250000")):
        env = {**os.environ, CHECK_AFTER_ENV: value}
        cmd = [sys.executable, "-c", code]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.strip() == want, done.stderr[-2000:]


def test_timeout_from_the_environment_is_validated(monkeypatch) -> None:
    from autotaxer.kernels.common.watch import timeout_from_env

    from autotaxer.runtime.dispatch import RuntimeConfig

    monkeypatch.setenv("AUTOTAXER_PEER_TIMEOUT", "2.5")
    assert timeout_from_env() == 2.5 and RuntimeConfig().peer_timeout() == 2.5
    assert RuntimeConfig(peer_timeout_s=0.25).peer_timeout() == 0.25
    for bad in ("nan", "-1", "0", "inf", "soon"):
        monkeypatch.setenv("AUTOTAXER_PEER_TIMEOUT", bad)
        with pytest.raises(ValueError, match="AUTOTAXER_PEER_TIMEOUT"):
            RuntimeConfig().validate()
    monkeypatch.delenv("AUTOTAXER_PEER_TIMEOUT")
    for field in ("peer_timeout_s", "first_call_timeout_s"):
        for bad in (float("nan"), 0.0, -2.0, float("inf")):
            with pytest.raises(ValueError, match=field):
                RuntimeConfig(**{field: bad}).validate()
