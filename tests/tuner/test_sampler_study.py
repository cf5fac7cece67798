"""bench/sampler_study.py runs end to end on CPU ranks and writes its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sampler_study.py"


@pytest.mark.slow
def test_sampler_study_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "study.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--world-size",
        "2",
        "--m",
        "16",
        "--n",
        "8",
        "--k",
        "8",
    ]
    cmd += ["--dtype", "fp32", "--trials", "5", "--seeds", "0,1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["key"].startswith("ag_gemm|cpu|2|fp32|M=16,N=8,K=8")
    assert result["grid"]["points"] == 9  # bsp + cpu_chunked: chunks {1,2,4,8} x 2 orders
    assert result["grid"]["best_us"] > 0 and result["grid"]["bsp_us"] >= result["grid"]["best_us"]
    assert [r["seed"] for r in result["tpe"]] == [0, 1]
    for run in result["tpe"]:
        assert run["trials"] == 5
        hit = run["trials_to_within_3pct"]
        assert hit is None or 1 <= hit <= 5
    assert "tpe seed 0" in proc.stdout
