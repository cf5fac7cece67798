"""``bench/cost_model.py`` against the committed multi-GPU runs: it reads them all, predicts BSP as the
sum of its measured parts, and its many-peer terms move the way the design says they should."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _model():
    spec = importlib.util.spec_from_file_location("cost_model", ROOT / "bench" / "cost_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checks_every_world_size_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cost_model.py"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert {r["world_size"] for r in data["rows"]} == {2, 4, 8}
    assert all(r["M"] >= 256 for r in data["rows"])
    for r in data["rows"]:
        assert r["predicted_us"] > 0 and r["measured_us"] > 0
    assert {d["design"] for d in data["designs_ws8"]} == set(_model().DESIGNS)


def test_many_peer_terms() -> None:
    model = _model()
    base = {"comm_sms": 16, "row_chunks": 16, "k_chunks": 1, "group_m": 8, "block_m": 128, "block_n": 128}
    # gather_dim=0, 8 ranks, M=1024: one tile row per shard; grouping across the gathered M reads B less
    across = {**base, "group_across": 1}
    assert model.b_passes(1024, 8192, 8, 0, across) < model.b_passes(1024, 8192, 8, 0, base)
    one = model.fused("push", 1024, 8192, 8192, 8, 0, 180e-6, base, 300e9)
    each = model.fused("push", 1024, 8192, 8192, 8, 0, 180e-6, {**base, "release_each": 1}, 300e9)
    assert each["first"] < one["first"] and each["tail"] < one["tail"]
    # copy engine at gather_dim=1: grouping peers' K slices writes out fewer times
    group4 = {"streams": 8, "group": 4}
    grouped = model.copy_engine("ce_grouped", 1024, 8192, 8192, 8, 1, 180e-6, group4, 300e9)
    per_peer = model.copy_engine("copy_engine", 1024, 8192, 8192, 8, 1, 180e-6, {"chunks": 1}, 300e9)
    assert grouped["total"] < per_peer["total"]
