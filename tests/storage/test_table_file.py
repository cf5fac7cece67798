"""Table files: JSON/CSV round trips, atomic writes, and rejected inputs naming file, record and field."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _factories import make_record

from autotaxer.table_file import TABLE_SCHEMA_VERSION, TableFileError, read_table, write_table


@pytest.fixture
def recs():
    return [make_record(m, median_us=10.0 + m / 64) for m in (16, 64, 1024)] + [
        make_record(64, gpu="nvidia-h100-80gb-hbm3", ws=4, gather_dim=1)
    ]


@pytest.mark.parametrize("suffix", ["json", "csv"])
def test_round_trip(tmp_path, recs, suffix):
    path = tmp_path / f"table.{suffix}"
    assert write_table(recs, path) == len(recs)
    assert read_table(path) == recs
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_json_layout(tmp_path, recs):
    path = tmp_path / "t.json"
    write_table(recs, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "autotaxer-tuning-table"
    assert doc["schema_version"] == TABLE_SCHEMA_VERSION == 1
    assert "exported_at" in doc and len(doc["records"]) == len(recs)
    assert doc["records"][0]["params"]["local_first"] is True


def test_explicit_format_overrides_suffix(tmp_path, recs):
    path = tmp_path / "table.dat"
    write_table(recs, path, fmt="csv")
    assert path.read_text().startswith("# autotaxer-tuning-table schema_version=1\n")
    assert read_table(path) == recs  # sniffed as CSV


def test_unknown_suffix_rejected(tmp_path, recs):
    with pytest.raises(TableFileError, match="expected one of json, csv"):
        write_table(recs, tmp_path / "table.txt")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_old_file(tmp_path, recs, monkeypatch):
    path = tmp_path / "t.json"
    write_table(recs[:1], path)
    before = path.read_bytes()

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_table(recs, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def _json_doc(recs):
    return {"format": "autotaxer-tuning-table", "schema_version": 1, "records": [r.to_dict() for r in recs]}


def _write_json(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda d: d.pop("schema_version"), r"t\.json: field 'schema_version': missing"),
        (
            lambda d: d.update(schema_version=2),
            r"t\.json: field 'schema_version': version 2 is not supported",
        ),
        (lambda d: d.update(schema_version="1"), r"field 'schema_version': version '1' is not supported"),
        (lambda d: d.update(format="other"), r"t\.json: field 'format': expected 'autotaxer-tuning-table'"),
        (lambda d: d.update(records={}), r"t\.json: field 'records': expected a list"),
        (
            lambda d: d["records"][2].update(median_us="x"),
            r"t\.json: record 2: field 'median_us': not a number",
        ),
        (lambda d: d["records"][1].pop("variant"), r"t\.json: record 1: field 'variant': missing"),
        # times no call can take: the speedup would be inf, and no JSON file could hold it
        (
            lambda d: d["records"][1].update(median_us=1e-300, bsp_us=1e300),
            r"t\.json: record 1: field 'median_us': 1e-300 us is not a time one call can take",
        ),
        (
            lambda d: d["records"][0].update(bsp_us=1e300),
            r"t\.json: record 0: field 'bsp_us': 1e\+300 us is not a time one call can take",
        ),
        (lambda d: d["records"].append(5), r"t\.json: record 4: field '<record>': expected an object"),
        (
            lambda d: d["records"].append(d["records"][0]),
            r"t\.json: record 4: field 'shape': duplicate problem key",
        ),
    ],
)
def test_bad_json_rejected(tmp_path, recs, mutate, pattern):
    doc = _json_doc(recs)
    mutate(doc)
    with pytest.raises(TableFileError, match=pattern):
        read_table(_write_json(tmp_path, doc))


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("t.json", b'{"format": "autotaxer-tuning-table",\n "records": [}', r"t\.json:2: not valid JSON"),
        ("b.json", b"\x89PNG\r\n\x1a\n\x00\x00\x00", r"b\.json: not a text file"),
        ("l.csv", b"caf\xe9", r"l\.csv: not a text file"),
        ("e.json", b"  \n", r"e\.json: empty file"),
        ("list.json", b"[1, 2]", r"list\.json: expected a JSON object, got list"),
        ("missing.json", None, r"missing\.json.*cannot read"),
    ],
)
def test_not_json_not_text_empty(tmp_path, name: str, data: bytes | None, message: str) -> None:
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    with pytest.raises(TableFileError, match=message):
        read_table(path)


def _csv_lines(tmp_path, recs):
    path = tmp_path / "t.csv"
    write_table(recs, path)
    return path, path.read_text().splitlines()


def test_bad_csv_rejected(tmp_path, recs):
    path, lines = _csv_lines(tmp_path, recs)

    def check(new_lines, pattern):
        path.write_text("\n".join(new_lines) + "\n")
        with pytest.raises(TableFileError, match=pattern):
            read_table(path)

    check(lines[1:], r"t\.csv:1: missing schema version line")
    check(
        ["# autotaxer-tuning-table schema_version=7", *lines[1:]],
        r"t\.csv:1: field 'schema_version': version 7",
    )
    check([lines[0]], r"t\.csv:2: missing header line")
    check([lines[0], lines[1] + ",extra", *lines[2:]], r"t\.csv:2: field 'extra': unknown column")
    bad_row = lines[4].replace(",push,", ",,")
    check([*lines[:4], bad_row, *lines[5:]], r"t\.csv:5: field 'variant': must be a non-empty string")
    check([*lines[:3], lines[3] + ",1", *lines[4:]], r"t\.csv:4: expected 18 fields, got 19")
    shape_bad = lines[2].replace("M=16,", "M=x,")
    assert shape_bad != lines[2]
    check([*lines[:2], shape_bad, *lines[3:]], r"t\.csv:3: field 'shape': expected name=integer pairs")


def test_csv_blank_lines_are_skipped(tmp_path, recs):
    path, lines = _csv_lines(tmp_path, recs)
    path.write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n")
    assert read_table(path) == recs


def test_table_file_is_light():
    code = "import sys, autotaxer.table_file; print('sqlalchemy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
