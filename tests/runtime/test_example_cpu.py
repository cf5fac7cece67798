"""``examples/tp_block.py`` as a user runs it: under torchrun on CPU/gloo, its loss curve equal to the
unsharded model's in plain PyTorch (the script exits 1 otherwise), through autotaxer and with --plain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--plain"]], ids=["autotaxer", "plain"])
def test_the_block_trains_like_plain_pytorch_under_torchrun(extra: list[str]) -> None:
    from autotaxer.testing import free_port

    port = str(free_port())
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, wherever its script was installed
    cmd = [*torchrun, "--nproc-per-node", "2", "--master-port", port, str(ROOT / "examples" / "tp_block.py")]
    proc = subprocess.run([*cmd, "--steps", "3", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    losses = next(line for line in lines if line.startswith("loss:")).split()[1:]
    reference = next(line for line in lines if line.startswith("plain PyTorch:")).split()[2:]
    assert len(losses) == len(reference) == 3
    assert all(abs(float(a) - float(b)) <= 1e-3 for a, b in zip(losses, reference, strict=True))
    assert "ms per step" in lines[-1]


def test_device_cuda_without_gpus_is_one_clear_error(monkeypatch, capsys) -> None:
    """``--device cuda`` on a machine without GPUs: an error line naming the missing GPU and the CPU way,
    exit 2, before any process group is made."""
    import importlib.util

    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    spec = importlib.util.spec_from_file_location("tp_block", ROOT / "examples" / "tp_block.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "error: --device cuda: rank 0 needs GPU 0, 0 visible" in err and "leave --device out" in err
