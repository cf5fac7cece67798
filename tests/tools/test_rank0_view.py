"""``bench/rank0_view.py`` (one GPU's emulation of rank 0's ``ce_persistent`` call): what runs without a GPU,
its shape list and its refusal to run where a wait could block the queue a later rank's copy needs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "rank0_view.py"
_spec = importlib.util.spec_from_file_location("rank0_view_bench", SCRIPT)
rank0_view = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rank0_view)


def test_shapes_parse_with_their_weight_layout() -> None:
    assert rank0_view.parse_shapes("1024x2560x8192:nk, 4096x14336x8192,") == [
        (1024, 2560, 8192, "nk"),
        (4096, 14336, 8192, "kn"),
    ]


def test_it_refuses_to_run_without_32_hardware_queues() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "CUDA_DEVICE_MAX_CONNECTIONS=32" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_table_names_a_failed_row_and_a_row_the_host_outran() -> None:
    params = {"block_m": 128, "block_n": 256, "tma": 1, "signal": "triton"}
    base = {"M": 1024, "N": 2560, "b_layout": "nk", "poll": "load", "delay_us": 0.0, "params": params}
    rows = [
        {**base, "error": "RuntimeError: boom"},
        {**base, "rank0_us": 120.0, "others_us": 90.0, "cublas_us": 80.0, "ok": True,
         "enqueue_us_max": 4000.0, "gate_us": 3000.0},
    ]  # fmt: skip
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rank0_view.print_table(rows)
    lines = out.getvalue().splitlines()
    assert "ERROR RuntimeError: boom" in lines[1]
    assert "1.50" in lines[2] and "(enqueue outran the gate)" in lines[2]


class _Staged:
    """A staged buffer's stand-in: its address."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _hosted(in_order: bool) -> object:
    """A :class:`HostSources` over made-up addresses (no GPU): rank 0's inbox at [1000, 2000), shards of
    100 bytes on the device at 10_000 + 1000 r, staged at 50_000 + 1000 r."""
    hosted = object.__new__(rank0_view.HostSources)
    hosted.inbox, hosted.nbytes, hosted.in_order = (1000, 2000), 100, in_order
    hosted.device = [10_000 + 1000 * r for r in range(4)]
    hosted.host = [_Staged(50_000 + 1000 * r) for r in range(4)]
    hosted.landed = []
    return hosted


def test_host_sources_copy_the_staged_rows_into_rank0_and_leave_out_the_rest(monkeypatch) -> None:
    """``--source host_together``: a copy into rank 0's inbox reads the staged shard at the same offset;
    a copy to any other rank is not made at all (it would share PCIe with rank 0's rows)."""
    import torch

    made = []

    class _Event:
        def __init__(self, **_: object) -> None:
            pass

        def record(self, stream: object) -> None:
            made.append(("event", stream))

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    hosted = _hosted(in_order=False)
    copy = lambda dst, src, n, stream: made.append((dst, src, n, stream))  # noqa: E731
    hosted.copy(copy, 1200, 12_040, 30, "lane")  # rank 2's rows from offset 40 into rank 0's inbox
    hosted.copy(copy, 3000, 11_000, 30, "lane")  # rank 1's rows to another rank: left out
    assert made == [(1200, 52_040, 30, "lane"), ("event", "lane")]
    assert [rank for rank, _ in hosted.landed] == [2]


def test_host_sources_in_order_wait_instead_of_the_left_out_copy(monkeypatch) -> None:
    """``--source host``: the left-out copy becomes a wait of the time it would take, so that the next
    copy on that lane lands when it would on peers."""
    waits = []

    class _Spin:
        def __getitem__(self, grid: tuple[int]) -> object:
            return lambda out, ns: waits.append((grid, ns))

    hosted = _hosted(in_order=True)
    hosted.spin, hosted.spun, hosted.bytes_per_us = _Spin(), None, 2.0
    hosted.copy(lambda *a: waits.append(a), 3000, 11_000, 30, "lane")
    assert waits == [((1,), 15_000)]  # 30 bytes at 2 bytes a µs: 15 µs


def test_set_overrides_parse_and_a_bad_item_is_named() -> None:
    import pytest

    assert rank0_view.parse_set("group_m=2, order=1,") == {"group_m": 2, "order": 1}
    assert rank0_view.parse_set("") == {}
    with pytest.raises(ValueError, match="'order' is not name=integer"):
        rank0_view.parse_set("group_m=2,order")
    env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--set", "tma=yes"], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "'tma=yes' is not name=integer" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
