"""``bench/calls.py``: ``agreement`` on a made-up layer run (a confirmed record's speedup over torch's fused
op against the replay, an unconfirmed record without a ratio, and a case's step gain beside the predicted
one), and ``served-vs-trial`` end to end on one CPU process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from _factories import make_record

from autotaxer.storage import open_database

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "calls.py"
_spec = importlib.util.spec_from_file_location("calls_bench", SCRIPT)
calls_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calls_bench)


def test_keys_and_cases_of_a_layer_run(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    confirmed = make_record(256, median_us=50.0, bsp_us=80.0, confirmed=True)
    confirmed = replace(confirmed, env={**confirmed.env, "confirmed_us": "push=50,bsp=80,torch_fused=60"})
    unconfirmed = make_record(4096, median_us=500.0, bsp_us=900.0)
    with open_database(url) as db:
        db.upsert_winners([confirmed, unconfirmed])
    call = {"op": "fused_all_gather_matmul", "served": True}
    calls = [
        {**call, "key": confirmed.key.text, "torch_ms": 0.0605, "autotaxer_ms": 0.050},  # x1.21 vs x1.20
        {**call, "key": unconfirmed.key.text, "torch_ms": 1.0, "autotaxer_ms": 0.8},
    ]
    results = {
        "fwd:256": {"async_tp": {"ms": 1.0}, "async_tp_autotaxer": {"ms": 0.99}},
        "async_tp_calls": calls,
    }
    layer = tmp_path / "layer.json"
    layer.write_text(json.dumps({"results": results, "config": {"batch": 1}}))
    out = tmp_path / "agreement.json"
    assert calls_bench.main(["agreement", "--layer", str(layer), "--db", url, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    first, second = doc["keys"]
    assert first["stored_x_torch"] == pytest.approx(1.2) and first["stored_x_bsp"] == pytest.approx(1.6)
    assert first["replay"] == pytest.approx(1.21) and first["agree"] is True
    assert second["confirmed"] is False and "agree" not in second and "stored_x_bsp" not in second
    (case,) = doc["cases"]  # M=256 is fwd:256's call: its 10.5 µs saving predicts the step
    assert case["step_gain"] == pytest.approx(1 / 0.99) and case["predicted_gain"] == pytest.approx(
        1 / 0.9895
    )
    assert "unconfirmed" in capsys.readouterr().out


def test_served_vs_trial_times_every_entry_on_one_cpu_process(tmp_path: Path) -> None:
    out = tmp_path / "svt.json"
    launch = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")
    env = {k: v for k, v in os.environ.items() if k not in launch}
    args = ["--variant", "bsp", "--params", "{}", "--M", "64", "--N", "32", "--K", "32", "--iters", "2"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "served-vs-trial", *args, "--samples", "2", "--warmup", "1",
         "--json-out", str(out)],
        capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": ""}, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    entries = ("trial", "eager", "fresh_out", "serve", "async_tp", "dispatcher")
    assert doc["variant"] == "bsp" and sorted(doc["interleaved_us"]) == sorted(entries)
    assert all(doc["interleaved_us"][e] > 0 for e in entries), doc["interleaved_us"]
    assert sorted(doc["replay_timing_us"]) == ["async_tp", "dispatcher", "trial"]
