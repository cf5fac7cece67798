"""``bench/merge_table.sh``: re-tuned records replace the shipped ones of their keys; the rest stays."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "tuning_db" / "nvidia-h200_ws2_graph.json"


def _key(r: dict) -> tuple:
    return (r["op"], json.dumps(r["shape"], sort_keys=True), json.dumps(r["layout"], sort_keys=True))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_retuned_records_replace_theirs_and_the_rest_stay(tmp_path: Path) -> None:
    shipped = json.loads(SHIPPED.read_text())
    ag = [r for r in shipped["records"] if r["op"] == "ag_gemm"]
    # a re-tune that found one shape slower (must still replace: the kernels changed) and one faster
    slower, faster = dict(ag[0]), dict(ag[1])
    slower["median_us"] *= 1.5
    slower["speedup"] = slower["bsp_us"] / slower["median_us"]
    faster["median_us"] *= 0.5
    faster["speedup"] = faster["bsp_us"] / faster["median_us"]
    new = tmp_path / "new.json"
    new.write_text(json.dumps(dict(shipped, records=[slower, faster])))
    out = tmp_path / "merged.json"
    subprocess.run(
        ["bash", str(ROOT / "bench" / "merge_table.sh"), str(SHIPPED), str(new), str(out)],
        check=True, env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    merged = {_key(r): r for r in json.loads(out.read_text())["records"]}
    assert len(merged) == len(shipped["records"])
    for r in (slower, faster):
        assert merged[_key(r)]["median_us"] == pytest.approx(r["median_us"])
    for r in shipped["records"]:
        if _key(r) not in (_key(slower), _key(faster)):
            assert merged[_key(r)]["median_us"] == pytest.approx(r["median_us"]), _key(r)
            assert merged[_key(r)]["variant"] == r["variant"]
    assert {r["op"] for r in merged.values()} == {"ag_gemm", "flash_decode"}


def test_bad_table_fails_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "merge_table.sh"), str(SHIPPED), str(bad), str(out)],
        env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    assert not out.exists()
