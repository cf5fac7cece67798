"""``bench/speedup_agreement.py`` on a made-up layer run: a confirmed record's speedup over torch's fused op
against the replay, an unconfirmed record without a ratio, and a case's step gain beside the predicted one."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
from _factories import make_record

from autotaxer.storage import open_database

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("speedup_agreement", ROOT / "bench" / "speedup_agreement.py")
agreement = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agreement)


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
    assert agreement.main(["--layer", str(layer), "--db", url, "--out", str(out)]) == 0
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
