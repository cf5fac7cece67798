"""``bench/pick_retuned.py``: after a re-tune, stale and missing records are taken, current ones only
when the re-tune beat them by more than the margin."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "tuning_db" / "nvidia-h200_ws2_graph.json"


def _pick_module():
    spec = importlib.util.spec_from_file_location("pick_retuned", ROOT / "bench" / "pick_retuned.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _faster(rec, factor: float):
    return dataclasses.replace(rec, median_us=rec.median_us / factor)


def test_stale_and_new_keys_are_taken_current_ones_only_when_beaten(tmp_path: Path) -> None:
    from autotaxer.table_file import read_table, write_table

    pick = _pick_module()
    shipped = [r for r in read_table(SHIPPED) if r.key.op == "ag_gemm"]
    current, beaten, stale, gone = shipped[:4]
    shipped[2] = dataclasses.replace(stale, kernel_hash="0" * 64)  # tuned with other kernel sources
    del shipped[3]  # a key the shipped table lacks
    new = [_faster(current, 1.01), _faster(beaten, 1.05), _faster(stale, 0.8), gone]
    picked, lines = pick.pick(shipped, new, margin=0.02)
    assert [r.key for r in picked] == [beaten.key, stale.key, gone.key]  # slower, but the shipped is stale
    assert lines[0].startswith("keep") and all(line.startswith("take") for line in lines[1:])
    # the command line writes the picked records as a table file merge_table.sh reads
    write_table(shipped, tmp_path / "shipped.json")
    write_table(new, tmp_path / "new.json")
    out = tmp_path / "picked.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pick_retuned.py"), str(tmp_path / "shipped.json"),
         str(tmp_path / "new.json"), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "3 of 4 records picked" in run.stdout
    assert len(json.loads(out.read_text())["records"]) == 3
