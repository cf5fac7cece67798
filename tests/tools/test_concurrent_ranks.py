"""``bench/concurrent_ranks.py`` (the fused kernels on emulated ranks running at once): what runs without a
GPU, its refusals before anything touches CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "concurrent_ranks.py"


def _run(*args: str, connections: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    if connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_it_refuses_to_run_without_32_hardware_queues() -> None:
    proc = _run(connections=None)
    assert proc.returncode == 2 and "CUDA_DEVICE_MAX_CONNECTIONS=32" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_it_names_a_variant_that_does_not_wait_in_the_kernel() -> None:
    proc = _run("--variants", "push_tma,copy_engine", connections="32")
    assert proc.returncode == 2, proc.stderr
    assert "--variants: copy_engine not one of push, push_tma, pull" in proc.stderr
    assert "Traceback" not in proc.stderr
