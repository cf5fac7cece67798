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
