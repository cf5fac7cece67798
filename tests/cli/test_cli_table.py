"""The CLI end to end on records written by the tests: db upgrade, show, export, import, bad inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from _factories import make_record
from typer.testing import CliRunner

from autotaxer.cli import app
from autotaxer.storage import open_database
from autotaxer.table_file import read_table, write_table

runner = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "250"})


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path}/src.sqlite"
    with open_database(url) as db:
        db.upsert_winners(
            [
                make_record(16, median_us=20.0, bsp_us=30.0, confirmed=True),
                make_record(1024, median_us=200.0, bsp_us=250.0, variant="pull", confirmed=True),
                make_record(16, gpu="nvidia-h100-80gb-hbm3"),
                make_record(16, ws=4),
            ]
        )
    return url


def _db_rows(url):
    with open_database(url) as db:
        return [r.to_dict() for r in db.winners()]


def test_help_and_db_upgrade(tmp_path):
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("show", "export", "import", "db", "doctor"):
        assert command in result.output
    url = f"sqlite:///{tmp_path}/new.sqlite"
    result = invoke("db", "upgrade", "--db", url)
    assert result.exit_code == 0, result.output
    assert "revision 0002, up to date" in result.output
    assert (tmp_path / "new.sqlite").is_file()
    result = invoke("db", "current", "--db", url, "--format", "json")
    assert json.loads(result.output) == {"url": url, "revision": "0002", "head": "0002", "up_to_date": True}


def test_db_from_environment(tmp_path):
    url = f"sqlite:///{tmp_path}/env.sqlite"
    result = runner.invoke(app, ["db", "upgrade", "--quiet"], env={"AUTOTAXER_DB": url})
    assert result.exit_code == 0 and result.output == ""
    assert (tmp_path / "env.sqlite").is_file()


def test_show_human_and_json(url):
    result = invoke("show", "--db", url, "--gpu", "nvidia-h200", "--world-size", "2")
    assert result.exit_code == 0, result.output
    assert "1.50×" in result.output and "1.25×" in result.output  # speedup vs BSP
    assert "M=16 N=8192 K=8192" in result.output and "pull" in result.output  # compact by default
    assert "nvidia-h100" not in result.output
    wide = invoke("show", "--db", url, "--gpu", "nvidia-h200", "--world-size", "2", "--wide")
    assert "M=16,N=8192,K=8192" in wide.output and "pull" in wide.output
    result = invoke("show", "--db", url, "--format", "json", "--op", "ag_gemm")
    rows = json.loads(result.output)
    assert len(rows) == 4 and {r["speedup"] for r in rows} >= {1.5, 1.25}
    result = invoke("show", "--db", url, "--gpu", "amd-instinct-mi300x")
    assert result.exit_code == 0 and "no winners" in result.output


def test_show_writes_the_stale_records_shapes_for_a_retune(tmp_path, url):
    from autotaxer.runtime.kernel_hash import kernel_source_hash
    from autotaxer.shapes import load_shapes

    current = make_record(64, variant="bsp")  # tuned with today's sources and no recorded versions
    today = kernel_source_hash("ag_gemm", "bsp")
    current = dataclasses.replace(current, kernel_hash=today, env={}, params={})
    with open_database(url) as db:
        db.upsert_winner(current)
    out = tmp_path / "stale.csv"
    result = invoke("show", "--db", url, "--gpu", "nvidia-h200", "--world-size", "2", "--stale-out", out)
    assert result.exit_code == 0, result.output
    assert "wrote 2 stale ag_gemm shape(s)" in result.output
    rows = load_shapes(out, world_size=2)  # what `autotaxer tune --shapes` reads
    assert sorted(r.to_key("nvidia-h200", 2)["M"] for r in rows) == [16, 1024]  # not the current M=64


@pytest.mark.parametrize("suffix", ["json", "csv"])
def test_export_with_filters(tmp_path, url, suffix):
    out = tmp_path / f"h200.{suffix}"
    result = invoke(
        "export", "--db", url, "--out", out, "--gpu", "nvidia-h200", "--world-size", "2", "--op", "ag_gemm"
    )
    assert result.exit_code == 0, result.output
    assert "exported 2 record(s)" in result.output
    recs = read_table(out)
    assert sorted(r.key["M"] for r in recs) == [16, 1024]
    assert all(r.key.gpu_model == "nvidia-h200" and r.key.world_size == 2 for r in recs)
    explicit = tmp_path / "table.out"
    assert invoke("export", "--db", url, "--out", explicit, "--file-format", "csv").exit_code == 0
    assert len(read_table(explicit)) == 4


def test_export_keeps_the_records_of_one_timing(tmp_path):
    url = f"sqlite:///{tmp_path}/mixed.sqlite"
    graph = dataclasses.replace(make_record(1024), env={**make_record().env, "timing": "graph"})
    with open_database(url) as db:
        db.upsert_winners([make_record(16), make_record(64, variant="pull"), graph])
    out = {t: tmp_path / f"{t}.json" for t in ("eager", "graph")}
    for t, path in out.items():
        result = invoke("export", "--db", url, "--out", path, "--timing", t)
        assert result.exit_code == 0, result.output
    assert sorted(r.key["M"] for r in read_table(out["eager"])) == [16, 64]  # unstamped records are eager
    assert [(r.key["M"], r.env["timing"]) for r in read_table(out["graph"])] == [(1024, "graph")]
    result = invoke("export", "--db", url, "--out", tmp_path / "x.json", "--timing", "replay")
    assert result.exit_code == 2 and "expected one of eager, graph" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_import_merge_and_replace(tmp_path, url):
    out = tmp_path / "all.json"
    assert invoke("export", "--db", url, "--out", out).exit_code == 0
    dest = f"sqlite:///{tmp_path}/dest.sqlite"
    result = invoke("import", out, "--db", dest)
    assert result.exit_code == 0, result.output
    assert "4 written, 0 kept" in result.output
    assert _db_rows(dest) == _db_rows(url)

    slower = [
        make_record(16, median_us=25.0, variant="slow"),
        make_record(1024, median_us=100.0, variant="fast"),
    ]
    table = tmp_path / "mixed.csv"
    write_table(slower, table)
    result = invoke("import", table, "--db", dest)
    assert result.exit_code == 0 and "1 written, 1 kept" in result.output
    with open_database(dest) as db:
        assert {r.key["M"]: r.variant for r in db.winners(gpu_model="nvidia-h200", world_size=2)} == {
            16: "push",
            1024: "fast",
        }
    result = invoke("import", table, "--db", dest, "--replace")
    assert result.exit_code == 0 and "2 written, 0 kept" in result.output
    with open_database(dest) as db:
        assert db.get_winner(slower[0].key).variant == "slow"


def _bad_tables(tmp_path):
    good = [make_record(8), make_record(9)]
    path = tmp_path / "good.json"
    write_table(good, path)
    doc = json.loads(path.read_text())
    wrong_version = dict(doc, schema_version=2)
    malformed_last = json.loads(path.read_text())
    malformed_last["records"][-1]["bsp_us"] = -1
    huge_ws, huge_sms, huge_m = (json.loads(path.read_text()) for _ in range(3))
    huge_ws["records"][0]["world_size"] = 2**63
    huge_sms["records"][1]["num_sms"] = 2**64
    huge_m["records"][0]["shape"]["M"] = 2**40
    cases = {
        "huge_world_size.json": (
            json.dumps(huge_ws),
            "record 0: field 'world_size': must be <= 65536",
        ),
        "huge_num_sms.json": (json.dumps(huge_sms), "record 1: field 'num_sms': must be <= "),
        "huge_m.json": (json.dumps(huge_m), "record 0: field 'shape': M: must be <= 2147483647"),
        "wrong_version.json": (
            json.dumps(wrong_version),
            "field 'schema_version': version 2 is not supported",
        ),
        "malformed.json": (json.dumps(malformed_last), "record 1: field 'bsp_us': must be a positive"),
        "not_json.json": ("{oops", "not valid JSON"),
        "pickle.json": (b"\x80\x04\x95\x00\x00\x00", "not a text file"),
        "empty.csv": ("", "empty file"),
    }
    for name, (content, _) in cases.items():
        target = tmp_path / name
        target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    return cases


def test_import_bad_files_write_nothing(tmp_path, url):
    before = _db_rows(url)
    fresh = tmp_path / "fresh.sqlite"
    for name, (_, fragment) in _bad_tables(tmp_path).items():
        for target_url in (url, f"sqlite:///{fresh}"):
            result = invoke("import", tmp_path / name, "--db", target_url)
            assert result.exit_code == 2, (name, result.output)
            assert result.stderr.startswith(f"error: {tmp_path / name}"), result.stderr
            assert fragment in result.stderr, result.stderr
        assert _db_rows(url) == before
        assert not fresh.exists()  # a bad file is rejected before the database is even opened


def test_export_bad_inputs_write_nothing(tmp_path, url):
    result = invoke("export", "--db", url, "--out", tmp_path / "t.txt")
    assert (
        result.exit_code == 2 and "error:" in result.stderr and "expected one of json, csv" in result.stderr
    )
    assert not (tmp_path / "t.txt").exists()
    result = invoke("export", "--db", url, "--out", tmp_path / "no" / "dir" / "t.json")
    assert result.exit_code == 1 and result.stderr.startswith("error:")
    result = invoke("show", "--db", url, "--world-size", "0")
    assert result.exit_code == 2  # option validation


def test_bad_databases_give_clear_errors(tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"this is not a database" * 100)
    before = corrupt.read_bytes()
    table = tmp_path / "t.json"
    write_table([make_record()], table)
    for args in (["show"], ["db", "upgrade"], ["import", table], ["export", "--out", tmp_path / "o.json"]):
        result = invoke(*args, "--db", f"sqlite:///{corrupt}")
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith(f"error: {corrupt}: not an SQLite database"), result.stderr
    assert corrupt.read_bytes() == before
    assert not (tmp_path / "o.json").exists()
    result = invoke("show", "--db", "nosuchdialect://x")
    assert result.exit_code == 2 and "cannot create an engine" in result.stderr


def _special(tmp_path, kind: str):
    """A path that is not a regular file: a FIFO, a folder, a symlink to a device (never a device itself:
    the old code replaced it, and a test must not write outside its tmp folder)."""
    import os

    if kind == "fifo":
        path = tmp_path / "pipe.json"
        os.mkfifo(path)
    elif kind == "folder":
        path = tmp_path / "adir.json"
        path.mkdir()
    else:
        path = tmp_path / "link.json"
        path.symlink_to("/dev/null")
    return path


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink to a device"])
def test_export_refuses_a_path_that_is_not_a_regular_file_and_leaves_it(tmp_path, url, kind):
    import os
    import stat

    path = _special(tmp_path, kind)
    before = os.lstat(path)
    result = invoke("export", "--db", url, "--out", path, "--file-format", "json")
    assert result.exit_code == 2, result.output
    assert "refusing to replace it" in result.stderr and "Traceback" not in result.output
    after = os.lstat(path)
    assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode) and after.st_ino == before.st_ino
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_export_writes_through_a_symlink_and_a_new_table_is_readable_by_others(tmp_path, url):
    import os
    import stat

    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    old = os.umask(0o022)
    try:
        assert invoke("export", "--db", url, "--out", link).exit_code == 0
        assert invoke("export", "--db", url, "--out", tmp_path / "new.json").exit_code == 0
    finally:
        os.umask(old)
    assert link.is_symlink() and len(read_table(target)) == 4  # the link kept, its target written
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644


def test_bench_refuses_an_output_folder_before_the_run(tmp_path):
    from pathlib import Path

    shapes = Path(__file__).resolve().parents[2] / "examples" / "shapes_cpu.csv"
    out = tmp_path / "adir"
    out.mkdir()
    args = ["bench", "--world-size", "2", "--shapes", shapes, "--device", "cpu", "--out", out]
    result = invoke(*args, "--db", f"sqlite:///{tmp_path}/t.sqlite", "--yes")
    assert result.exit_code == 2, result.output
    assert "--out" in result.stderr and "is a directory; refusing" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # no adir.tmp, no adir.rows.jsonl


def test_read_commands_leave_nothing_beside_the_database(tmp_path, url):
    """show, export and doctor read a WAL database and leave no -wal or -shm file beside it."""
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"src.sqlite"}, names
    for args in (("show",), ("export", "--out", tmp_path / "out" / "t.json"), ("doctor",), ("db", "current")):
        (tmp_path / "out").mkdir(exist_ok=True)
        result = invoke(*args, "--db", url)
        assert result.exit_code == 0, (args, result.output)
        left = {p.name for p in tmp_path.iterdir()} - {"out"}
        assert left == {"src.sqlite"}, (args, left)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"shape": {"X": 1}}, "shape fields X, expected M, N, K"),
        ({"shape": {"M": 16, "N": 8192}}, "shape fields M, N, expected M, N, K"),
        ({"layout": {"gather_dim": 0, "colour": 1}}, "layout colour=1 is not one of ag_gemm's layouts"),
        ({"op": "no_such_op"}, "op 'no_such_op' is not registered"),
    ],
)
def test_import_refuses_a_record_that_is_no_problem_of_its_op(tmp_path, url, change, fragment):
    """A record whose key no op serves (``shape {"X": 1}``) is refused on import, by record and field:
    stored, it broke ``show --stale-out`` with a traceback."""
    path = tmp_path / "t.json"
    write_table([make_record(16)], path)
    doc = json.loads(path.read_text())
    doc["records"][0].update(change)
    path.write_text(json.dumps(doc))
    before = _db_rows(url)
    result = invoke("import", path, "--db", url)
    assert result.exit_code == 2, result.output
    assert f"error: {path}: record 1" in result.stderr and fragment in result.stderr, result.stderr
    assert _db_rows(url) == before


def test_show_stale_out_refuses_a_fifo_and_leaves_it(tmp_path, url):
    import os
    import stat

    path = _special(tmp_path, "fifo")
    result = invoke("show", "--db", url, "--stale-out", path)
    assert result.exit_code == 2, result.output
    assert "--stale-out" in result.stderr and "is a FIFO; refusing to replace it" in result.stderr
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
