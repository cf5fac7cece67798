"""``autotaxer merge``: re-tuned records join a table file; stale and missing records are taken, current ones
only when beaten by more than the margin (every one with ``--all``); the rest of the table stays."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotaxer.cli import app
from autotaxer.cli.merge import pick
from autotaxer.table_file import read_table, write_table

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "tuning_db" / "nvidia-h200_ws2_graph.json"


def _records() -> list:
    """The shipped records, none stale (no kernel hash: current whatever the sources)."""
    return [dataclasses.replace(r, kernel_hash=None) for r in read_table(SHIPPED)]


def _faster(rec, factor: float):
    return dataclasses.replace(rec, median_us=rec.median_us / factor)


def test_pick_takes_stale_and_new_keys_and_current_ones_only_when_beaten() -> None:
    shipped = [r for r in _records() if r.key.op == "ag_gemm"]
    current, beaten, stale, gone = shipped[:4]
    shipped[2] = dataclasses.replace(stale, kernel_hash="0" * 64)  # tuned with other kernel sources
    del shipped[3]  # a key the shipped table lacks
    new = [_faster(current, 1.01), _faster(beaten, 1.05), _faster(stale, 0.8), gone]
    picked, lines = pick(shipped, new, margin=0.02)
    assert [r.key for r in picked] == [beaten.key, stale.key, gone.key]  # slower, but the shipped is stale
    assert lines[0].startswith("keep") and all(line.startswith("take") for line in lines[1:])
    assert [r.key for r in pick(shipped, new, margin=None)[0]] == [r.key for r in new]


def test_merge_replaces_the_picked_records_and_keeps_every_other(tmp_path: Path) -> None:
    records = _records()
    ag = [i for i, r in enumerate(records) if r.key.op == "ag_gemm"]
    slower, faster = _faster(records[ag[0]], 0.5), _faster(records[ag[1]], 1.5)
    new = tmp_path / "new.json"
    write_table([slower, faster], new)
    table = tmp_path / "table.json"
    write_table(records, table)
    result = CliRunner().invoke(app, ["merge", str(table), str(new)])
    assert result.exit_code == 0, result.output
    assert "1 of 2 new record(s) taken" in result.output
    assert "shipped" not in result.output and "keep  ag_gemm" in result.output  # the user's own table
    merged = {r.key: r for r in read_table(table)}
    assert len(merged) == len(records)
    assert merged[faster.key].median_us == pytest.approx(faster.median_us)
    assert merged[slower.key].median_us == pytest.approx(records[ag[0]].median_us)  # current, kept
    assert {r.key.op for r in merged.values()} == {r.key.op for r in records}  # every op's records kept
    out = tmp_path / "all.json"
    result = CliRunner().invoke(app, ["merge", str(table), str(new), "--all", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {r.key: r for r in read_table(out)}[slower.key].median_us == pytest.approx(slower.median_us)


@pytest.mark.parametrize("problem", ["not json", "other timing"])
def test_bad_input_fails_cleanly_without_writing(tmp_path: Path, problem: str) -> None:
    records = _records()
    table = tmp_path / "table.json"
    write_table(records, table)
    before = table.read_bytes()
    new = tmp_path / "new.json"
    if problem == "not json":
        new.write_text("{not json")
    else:
        eager = dataclasses.replace(records[0], env={**records[0].env, "timing": "eager"})
        write_table([eager], new)
    result = CliRunner().invoke(app, ["merge", str(table), str(new), "--out", str(tmp_path / "out.json")])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out.json").exists() and table.read_bytes() == before
    if problem == "other timing":
        assert "timing mode" in result.output
    json.loads(before)  # the table itself untouched and whole
