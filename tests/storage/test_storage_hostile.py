"""Files autotaxer does not own and disks that fail: a read never writes (no table, no journal-mode
switch, no new file), another application's SQLite file is refused by name and left byte for byte,
a read-only filesystem is called read-only, a full disk ends with a clean error and a resumable trial,
a newer Optuna schema is refused by name, and an import never silently replaces the other timing mode."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from _factories import FAST, KEY, InlineExecutor, make_record
from typer.testing import CliRunner

from autotaxer.cli import app
from autotaxer.table_file import write_table

runner = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "200"})


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file of ``folder`` with the hash of its bytes."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def _foreign(tmp_path: Path) -> Path:
    folder = tmp_path / "app"
    folder.mkdir()
    path = folder / "app.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.commit()
    con.close()
    return path


def test_another_applications_sqlite_file_is_refused_and_left_untouched(tmp_path) -> None:
    path = _foreign(tmp_path)
    url = f"sqlite:///{path}"
    table = tmp_path / "t.json"
    write_table([make_record()], table)
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n8,8,8\n")
    before = _snapshot(path.parent)
    commands = [
        ["show"], ["export", "--out", tmp_path / "o.json"], ["import", table], ["db", "current"],
        ["db", "upgrade"], ["tune", "--world-size", "2", "--device", "cpu", "--shapes", shapes],
    ]  # fmt: skip
    for args in commands:
        result = invoke(*args, "--db", url)
        assert result.exit_code != 0, (args, result.output)
        assert "not an autotaxer database (it holds the tables users)" in result.output, (args, result.output)
        assert "Traceback" not in result.output
        assert _snapshot(path.parent) == before, args
    import autotaxer
    from autotaxer.runtime.dispatch import ConsensusError

    rt = autotaxer.Runtime(autotaxer.RuntimeConfig(db_url=url, env_tables=False, shipped_tables=False,
                                                   persist_misses=False))  # fmt: skip
    with pytest.raises((ConsensusError, Exception), match="not an autotaxer database"):
        rt.load("cpu")
    assert _snapshot(path.parent) == before
    assert not (tmp_path / "o.json").exists()


def test_read_commands_write_nothing_to_an_autotaxer_database(tmp_path) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    url = f"sqlite:///{folder / 't.sqlite'}"
    table = tmp_path / "t.json"
    write_table([make_record(16), make_record(32)], table)
    assert invoke("import", table, "--db", url).exit_code == 0
    con = sqlite3.connect(folder / "t.sqlite")  # a rollback-journal database: a read must not switch it
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    before = _snapshot(folder)
    for args in (["show"], ["show", "--wide"], ["export", "--out", tmp_path / "o.json"], ["db", "current"]):
        result = invoke(*args, "--db", url)
        assert result.exit_code == 0, (args, result.output)
        assert _snapshot(folder) == before, args
    con = sqlite3.connect(folder / "t.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()
    missing = tmp_path / "none" / "no.sqlite"
    result = invoke("show", "--db", f"sqlite:///{missing}")
    assert result.exit_code == 0 and "no tuning database there yet" in result.output
    assert not missing.parent.exists()  # a read creates nothing


def test_tables_without_their_schema_version_are_named(tmp_path) -> None:
    path = tmp_path / "t.sqlite"
    url = f"sqlite:///{path}"
    table = tmp_path / "t.json"
    write_table([make_record()], table)
    assert invoke("import", table, "--db", url).exit_code == 0
    con = sqlite3.connect(path)
    con.execute("DELETE FROM autotaxer_alembic_version")
    con.commit()
    con.close()
    before = path.read_bytes()
    for args in (["show"], ["import", table], ["db", "upgrade"]):
        result = invoke(*args, "--db", url)
        assert result.exit_code == 2, (args, result.output)
        assert "autotaxer's tables are there but their schema version is not" in result.output
    assert path.read_bytes() == before


def test_a_read_only_filesystem_is_called_read_only(tmp_path, monkeypatch) -> None:
    """Simulated (a read-only mount needs privileges CI lacks): every write check says the file cannot
    be written. Reads open it immutable and work; writes are refused as read-only, not corrupt."""
    from autotaxer.storage import _engine

    path = tmp_path / "t.sqlite"
    url = f"sqlite:///{path}"
    table = tmp_path / "t.json"
    write_table([make_record(16)], table)
    assert invoke("import", table, "--db", url).exit_code == 0
    before = _snapshot(tmp_path)
    monkeypatch.setattr(_engine, "_writable", lambda p: False)
    shown = invoke("show", "--db", url)
    assert shown.exit_code == 0 and "M=16 N=8192 K=8192" in shown.output, shown.output
    assert invoke("db", "current", "--db", url).exit_code == 0
    assert invoke("export", "--db", url, "--out", tmp_path / "o.json").exit_code == 0
    (tmp_path / "o.json").unlink()
    for args in (["import", table], ["db", "upgrade"]):
        result = invoke(*args, "--db", url)
        assert result.exit_code == 2 and "read-only" in result.output and "corrupt" not in result.output
    assert _snapshot(tmp_path) == before


def test_a_full_disk_ends_with_a_clean_error_and_an_interrupted_trial(tmp_path) -> None:
    """Simulated: the database raises SQLITE_FULL during a trial. ``tune`` ends with one ``error:``
    line (exit 1); the trial is marked interrupted, so the same command resumes and runs it again."""
    import sqlalchemy.exc

    from autotaxer._target import cpu_target
    from autotaxer.storage import open_database
    from autotaxer.tuner import TuneConfig, tune
    from autotaxer.tuner.study import open_study

    class FullDisk(InlineExecutor):
        def run(self, req, timeout_s, on_wait=None):
            if req.variant == "cpu_chunked":
                raise sqlalchemy.exc.OperationalError(
                    "UPDATE trials", {}, sqlite3.OperationalError("database or disk is full")
                )
            return super().run(req, timeout_s, on_wait)

    url = f"sqlite:///{tmp_path}/t.sqlite"
    with open_database(url) as db:
        with pytest.raises(sqlalchemy.exc.OperationalError):
            tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=FAST), FullDisk())
        study = open_study(db.optuna_storage(), KEY, None)
        states = [(t.state.name, bool(t.user_attrs.get("interrupted"))) for t in study.get_trials()]
        assert states[-1] == ("FAIL", True) and "RUNNING" not in [s for s, _ in states]
        results, _ = tune([KEY], cpu_target(), db, TuneConfig(trials=4, timing=FAST), InlineExecutor())
        assert results[0].stored and results[0].trials == 4

    def full(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError(
            "INSERT", {}, sqlite3.OperationalError("database or disk is full")
        )

    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n8,8,8\n")
    import autotaxer.tuner

    original = autotaxer.tuner.tune
    autotaxer.tuner.tune = full
    try:
        result = invoke(
            "tune", "--world-size", "1", "--device", "cpu", "--shapes", shapes, "--db", url, "--quiet"
        )
    finally:
        autotaxer.tuner.tune = original
    assert result.exit_code == 1, result.output
    assert "error:" in result.output and "database or disk is full" in result.output
    assert "re-run the same command to resume" in result.output and "Traceback" not in result.output


def test_an_optuna_schema_newer_than_the_installed_optuna_is_refused_by_name(tmp_path) -> None:
    import optuna

    from autotaxer.storage import open_database

    path = tmp_path / "t.sqlite"
    url = f"sqlite:///{path}"
    with open_database(url) as db:
        db.optuna_storage().engine.dispose()
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
    con.commit()
    con.close()
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n8,8,8\n")
    result = invoke(
        "tune", "--world-size", "1", "--device", "cpu", "--shapes", shapes, "--db", url, "--quiet"
    )
    assert result.exit_code == 2, result.output
    assert f"Optuna's tables do not fit the installed optuna {optuna.__version__}" in result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) <= 3


def test_an_import_never_silently_replaces_the_other_timing_mode(tmp_path) -> None:
    import dataclasses

    url = f"sqlite:///{tmp_path}/t.sqlite"
    eager = [make_record(m) for m in (16, 32, 64)]
    graph = [dataclasses.replace(r, env={**r.env, "timing": "graph"}, median_us=1.0) for r in eager[:2]]
    write_table(eager, tmp_path / "eager.json")
    write_table(graph, tmp_path / "graph.json")
    assert invoke("import", tmp_path / "eager.json", "--db", url).exit_code == 0
    before = (tmp_path / "t.sqlite").read_bytes()
    result = invoke("import", tmp_path / "graph.json", "--db", url)
    assert result.exit_code == 2, result.output
    assert (
        "2 record(s) are timed differently" in result.output
        and "2 stored eager-timed, graph-timed" in result.output
    )
    assert "--replace" in result.output and "Nothing was written" in result.output
    assert (tmp_path / "t.sqlite").read_bytes() == before
    result = invoke("import", tmp_path / "graph.json", "--db", url, "--replace")
    assert result.exit_code == 0 and "2 of them replaced records of the other timing mode" in result.output


@pytest.mark.parametrize("command", ["db upgrade", "tune"])
def test_a_newer_optuna_schema_is_refused_before_autotaxer_migrates_anything(tmp_path, command) -> None:
    """A 0001 database whose Optuna tables a newer Optuna wrote: refused (exit 2) and left at 0001, without
    the claims table, as the message says."""
    from sqlalchemy import inspect

    from autotaxer.storage import _migrate, open_database

    path = tmp_path / "t.sqlite"
    url = f"sqlite:///{path}"
    with open_database(url) as db:
        db.optuna_storage().engine.dispose()
        with db.engine.begin() as conn:
            _migrate.downgrade(conn, "0001")
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
    con.commit()
    con.close()
    before = _snapshot(tmp_path)
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n8,8,8\n")
    args = ["db", "upgrade"] if command == "db upgrade" else ["tune", "--world-size", "1", "--device", "cpu"]
    args += [] if command == "db upgrade" else ["--shapes", shapes]
    result = invoke(*args, "--db", url)
    assert result.exit_code == 2, result.output
    assert "Optuna's tables do not fit" in result.output and "the database was not modified" in result.output
    assert {k: v for k, v in _snapshot(tmp_path).items() if k != "s.csv"} == before
    with open_database(url, read_only=True) as db:
        assert db.current_revision() == "0001"
        assert "autotaxer_claims" not in inspect(db.engine).get_table_names()
