"""A process that opens its SQLite database again and again (a model's warm-up: a table load, then a
tuning session per group) never opens and closes the file itself while its connections hold locks:
closing any descriptor of the file drops them all (sqlite.org/howtocorrupt.html, 2.2), and a peer process
then deleted the WAL in use ("database disk image is malformed" in a 4-rank warm-up before the fix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotaxer.storage import DatabaseError, _engine, open_database


def test_the_header_is_read_once_per_process(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    open_database(url).close()  # made here: known to be SQLite
    opened = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        if self.name == "t.sqlite":
            opened.append(str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    for read_only in (False, True, False):
        with open_database(url, read_only=read_only) as db:
            db.winners()
    assert opened == []


def test_a_junk_file_is_still_refused_by_its_header(tmp_path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"M,N,K\n8,8,8\n" * 100)
    with pytest.raises(DatabaseError, match="not an SQLite database"):
        open_database(f"sqlite:///{junk}")


def test_the_schema_lock_keeps_one_descriptor_per_file(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    with open_database(url) as db:
        db.optuna_storage()
        name = str((tmp_path / "t.sqlite").resolve())
        fd, _ = _engine._LOCK_FDS[name]
        db.optuna_storage()
        assert _engine._LOCK_FDS[name][0] == fd  # the same descriptor, never closed between uses
    (tmp_path / "t.sqlite").unlink()  # a file deleted: its descriptor goes at the next lock taken
    with open_database(f"sqlite:///{tmp_path}/u.sqlite") as other:
        other.optuna_storage()
    assert name not in _engine._LOCK_FDS


def test_a_database_another_process_is_still_creating_is_a_source_of_no_records(tmp_path) -> None:
    """A launch's table load meets the file a concurrent launch has just made, before its schema: no
    records yet (it was "no such table: autotaxer_winners" on every rank of that launch)."""
    import sqlite3

    from autotaxer._target import cpu_target
    from autotaxer.runtime.table import TableSources, load_table

    path = tmp_path / "new.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = WAL")  # the file exists, with SQLite's header and no table
    con.close()
    sources = TableSources(db_url=f"sqlite:///{path}", env_tables=False, shipped_tables=False)
    assert load_table(sources, cpu_target(), env={}).records == {}
