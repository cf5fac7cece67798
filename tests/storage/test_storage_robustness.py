"""Bad databases are refused untouched; concurrent writers lose nothing; interrupted imports undo."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
from pathlib import Path

import pytest
from _factories import make_record

from autotaxer.storage import DatabaseError, _winners, open_database

# -- refused files ---------------------------------------------------------------------------------


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


@pytest.mark.parametrize(
    "content, fragment",
    [
        (os.urandom(4096), "not an SQLite database"),
        (b"SQLite format 3\x00" + b"\x13" * 4080, "corrupt SQLite database"),
        (b"M,N,K\n8,8,8\n", "not an SQLite database"),
    ],
)
def test_corrupt_file_refused_and_untouched(tmp_path, content, fragment):
    path = tmp_path / "t.sqlite"
    path.write_bytes(content)
    for upgrade in (True, False):
        with pytest.raises(DatabaseError, match=fragment) as e:
            open_database(f"sqlite:///{path}", upgrade=upgrade)
        assert str(path) in str(e.value) and "untouched" in str(e.value)
    assert path.read_bytes() == content
    assert _siblings(path) == ["t.sqlite"]  # no -wal / -shm / journal files


def _make_newer(path: Path) -> bytes:
    with open_database(f"sqlite:///{path}") as db:
        db.upsert_winner(make_record())
    con = sqlite3.connect(path)
    with con:
        con.execute("UPDATE autotaxer_alembic_version SET version_num = '0099_future'")
    con.close()
    return path.read_bytes()


def test_newer_schema_refused_and_untouched(tmp_path):
    path = tmp_path / "t.sqlite"
    before = _make_newer(path)
    for upgrade in (True, False):
        with pytest.raises(DatabaseError, match="schema revision '0099_future' is unknown") as e:
            open_database(f"sqlite:///{path}", upgrade=upgrade)
        assert "newer autotaxer" in str(e.value) and "not modified" in str(e.value)
    assert path.read_bytes() == before
    assert _siblings(path) == ["t.sqlite"]


def test_directory_is_refused(tmp_path):
    with pytest.raises(DatabaseError, match="is a directory"):
        open_database(f"sqlite:///{tmp_path}")


# -- concurrent writers ----------------------------------------------------------------------------


def _writer(url: str, first_m: int, median_base: float, parity: int, variant: str, barrier) -> None:
    barrier.wait(timeout=60)
    db = open_database(url)  # both processes may create and migrate the database at the same moment
    try:
        for i in range(50):
            db.upsert_winner(
                make_record(first_m + i, median_us=median_base + (i + parity) % 2, variant=variant)
            )
    finally:
        db.close()


def _winners_after_writers(tmp_path, specs) -> list:
    """The winners of a fresh SQLite database after one process per ``_writer`` spec wrote it at once."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(specs))
    procs = [ctx.Process(target=_writer, args=(url, *spec, barrier)) for spec in specs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    with open_database(url) as db:
        return db.winners()


@pytest.mark.slow
def test_two_processes_lose_no_records(tmp_path):
    recs = _winners_after_writers(tmp_path, [(1, 10.0, 0, "a"), (1001, 10.0, 0, "b")])
    assert sorted(r.key["M"] for r in recs) == list(range(1, 51)) + list(range(1001, 1051))


@pytest.mark.slow
def test_two_processes_on_the_same_keys_keep_the_faster(tmp_path):
    # Process "a" writes 10.0 on even i (11.0 on odd), "b" 10.5 on odd i (11.5 on even).
    recs = _winners_after_writers(tmp_path, [(1, 10.0, 0, "a"), (1, 10.5, 1, "b")])
    assert len(recs) == 50
    for r in recs:
        i = r.key["M"] - 1
        expected = ("a", 10.0) if i % 2 == 0 else ("b", 10.5)
        assert (r.variant, r.median_us) == expected, r.key.text


# -- interrupted imports ---------------------------------------------------------------------------


def _crashing_import(url: str, n_records: int, crash_after: int) -> None:
    calls = {"n": 0}
    original = _winners.write_one

    def write_then_crash(session, rec, replace, where):
        if calls["n"] == crash_after:
            session.flush()
            os._exit(3)  # the process dies mid-transaction, as on a kill -9 or power loss
        calls["n"] += 1
        return original(session, rec, replace, where)

    _winners.write_one = write_then_crash
    db = open_database(url)
    db.upsert_winners([make_record(100 + m, median_us=1.0) for m in range(n_records)])


def _snapshot(url: str) -> list[dict]:
    with open_database(url) as db:
        return [r.to_dict() for r in db.winners()]


@pytest.mark.slow
def test_crash_mid_transaction_leaves_database_as_it_was(tmp_path):
    url = f"sqlite:///{tmp_path}/t.sqlite"
    with open_database(url) as db:
        db.upsert_winners([make_record(m, median_us=5.0) for m in (100, 101, 102)])
    before = _snapshot(url)
    proc = mp.get_context("spawn").Process(target=_crashing_import, args=(url, 10, 6))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 3
    assert _snapshot(url) == before
    with open_database(url) as db:  # still a healthy, writable database
        assert db.upsert_winner(make_record(500))


def test_error_mid_transaction_rolls_back(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/t.sqlite"
    with open_database(url) as db:
        db.upsert_winners([make_record(m, median_us=5.0) for m in (100, 101)])
        before = [r.to_dict() for r in db.winners()]
        original = _winners.write_one
        calls = {"n": 0}

        def write_then_fail(session, rec, replace, where):
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt
            return original(session, rec, replace, where)

        monkeypatch.setattr(_winners, "write_one", write_then_fail)
        with pytest.raises(KeyboardInterrupt):
            db.upsert_winners([make_record(100 + m, median_us=1.0) for m in range(6)])
        monkeypatch.undo()
        assert [r.to_dict() for r in db.winners()] == before


def test_a_schema_creation_killed_before_its_indexes_is_completed_at_the_next_open(tmp_path) -> None:
    """A tuner killed between Optuna's ``CREATE TABLE studies`` and its unique index (SQLite runs them in
    separate transactions) must not leave a database where one key can get two studies."""
    import optuna

    url = f"sqlite:///{tmp_path}/k.sqlite"
    with open_database(url) as db:
        db.optuna_storage()
    con = sqlite3.connect(tmp_path / "k.sqlite")
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "ix_studies_study_name" in indexes
    con.execute("DROP INDEX ix_studies_study_name")  # what the kill left
    con.commit()
    con.close()
    with open_database(url) as db:
        storage = db.optuna_storage()
        optuna.create_study(study_name="k", storage=storage)
        with pytest.raises(optuna.exceptions.DuplicatedStudyError):
            optuna.create_study(study_name="k", storage=storage)
        assert optuna.load_study(study_name="k", storage=storage).study_name == "k"


def test_a_database_already_holding_a_key_twice_is_refused_by_name(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/k.sqlite"
    with open_database(url) as db:
        db.optuna_storage()
    con = sqlite3.connect(tmp_path / "k.sqlite")
    con.execute("DROP INDEX ix_studies_study_name")
    con.execute("INSERT INTO studies (study_id, study_name) VALUES (1, 'k'), (2, 'k')")
    con.commit()
    con.close()
    with (
        open_database(url) as db,
        pytest.raises(DatabaseError, match=r"k\.sqlite: Optuna's tables hold one key"),
    ):
        db.optuna_storage()
