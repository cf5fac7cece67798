"""``autotaxer doctor`` works without GPUs and reports versions, Iris and the database."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autotaxer.cli import app

runner = CliRunner(env={"AUTOTAXER_DB": None, "IRIS_ALLOCATOR": None})


def test_doctor_json_on_this_machine(tmp_path):
    url = f"sqlite:///{tmp_path}/d.sqlite"
    result = runner.invoke(app, ["doctor", "--db", url, "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["versions"]["autotaxer"] and report["versions"]["torch"]
    assert report["database"]["status"].startswith("not created yet")
    assert not (tmp_path / "d.sqlite").exists()  # doctor does not create databases
    gpus = report["gpus"]
    assert gpus["count"] == len(gpus["devices"]) == len(gpus["peer_access"])
    assert report["iris"]["allocator"] in ("vmem_chunked", "torch")
    runner.invoke(app, ["db", "upgrade", "--db", url])
    report = json.loads(runner.invoke(app, ["doctor", "--db", url, "--format", "json"]).output)
    assert (report["database"]["revision"], report["database"]["status"]) == ("0002", "ok")


def test_doctor_human_reports_allocator_choice_and_bad_database(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 10)
    result = runner.invoke(app, ["doctor", "--db", f"sqlite:///{bad}"], env={"IRIS_ALLOCATOR": "vmem"})
    assert result.exit_code == 2, result.output  # the report in full, and a refused database is a failure
    assert "allocator vmem (IRIS_ALLOCATOR)" in result.output
    assert "not an SQLite database" in result.output
    assert result.output.startswith("versions: autotaxer")
