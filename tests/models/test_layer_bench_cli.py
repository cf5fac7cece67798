"""``bench/layer.py`` on a machine without GPUs: one ``error:`` line and exit 2, the CPU smoke run named;
every option explained in ``--help``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "layer.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (
            (),
            "--device cuda: 2 rank(s) need 2 GPU(s), 0 visible; a CPU smoke run: python bench/layer.py",
        ),
        (("--device", "cpu"), "--device cpu: graph cases and the async_tp modes need CUDA"),
        (("--modes", "fast"), "--modes: unknown ['fast']"),
        (("--device", "cpu", "--cases", "fwd:x"), "--cases: 'fwd:x' is not train:S, fwd:S or graph:S"),
    ],
    ids=["no-gpu", "cpu-graph-cases", "unknown-mode", "bad-case"],
)
def test_a_run_it_cannot_make_ends_with_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    proc = _run(*args)
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {says}"), lines


def test_every_option_has_help(monkeypatch) -> None:
    spec = importlib.util.spec_from_file_location("layer_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    seen: list[argparse.ArgumentParser] = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        module.main([])
    options = [a for a in seen[0]._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 17
    assert [a.option_strings[0] for a in options if not a.help] == []


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_the_shipped_layer_shapes_files_are_what_the_layer_calls(world_size: int, tmp_path) -> None:
    """``examples/shapes_llama70b_layer_ws<N>.csv`` (the keys the shipped tables are tuned over) holds the
    rows ``bench/layer.py --write-shapes`` writes for the layer's training step at S = 256 ... 16384."""
    out = tmp_path / "shapes.csv"
    cases = ",".join(f"train:{s}" for s in (256, 1024, 4096, 8192, 16384))
    proc = _run("--write-shapes", str(out), "--world-size", str(world_size), "--cases", cases)
    assert proc.returncode == 0, proc.stderr
    shipped = SCRIPT.parents[1] / "examples" / f"shapes_llama70b_layer_ws{world_size}.csv"
    rows = [line for line in shipped.read_text().splitlines() if not line.startswith("#")]
    assert rows == out.read_text().splitlines()
    assert len(rows) == 41  # the header and 8 problems per sequence length


def _layer_module():
    spec = importlib.util.spec_from_file_location("layer_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_ratios_cancel_a_drift_the_medians_keep() -> None:
    """Two modes timed in the same repetitions while the machine drifts 2x: each mode's median mixes the
    drift in, the paired ratios do not (a 10% gain stays 1.10 in every repetition)."""
    layer = _layer_module()
    drift = [1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 2.0]
    base = [3.3 * d for d in drift]
    mine = [3.0 * d for d in drift]
    mine[2] = 3.0  # one repetition where only the mode's step ran fast
    median, q1, q3 = layer.paired(base, mine)
    assert median == pytest.approx(1.10) and q1 == pytest.approx(1.10) and q3 == pytest.approx(1.10)
    assert layer.paired([], []) is None
    modes = {"plain_compile": {"ms": 3.3, "samples_ms": base}, "x": {"ms": 3.0, "samples_ms": mine}}
    results = {"fwd:64": modes}
    table = layer._paired_table(results, ["plain_compile", "x"])
    assert "x torch.compile, paired" in table and "1.10 [1.10, 1.10]" in table
    assert "plain_compile " not in table.splitlines()[-1]  # no row of the reference against itself
