"""Connecting to the tuning database: the engine (SQLite: WAL mode, a busy timeout and every transaction
``BEGIN IMMEDIATE``; read-only connections that write nothing), the checks of an SQLite file made before
any engine touches it, and this process's descriptor of each file for cross-process locks."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event

from . import _migrate
from ._url import DatabaseError
from .models import VERSION_TABLE

#: Seconds a writer waits for SQLite's write lock before giving up.
SQLITE_BUSY_TIMEOUT_S = 30.0
_SQLITE_MAGIC = b"SQLite format 3\x00"

#: Descriptors of SQLite files this process flocks (:func:`._optuna.schema_lock`), never closed: closing
#: any descriptor of a database file drops every POSIX lock this process's SQLite connections hold on it
#: (sqlite.org/howtocorrupt.html, 2.2), and in WAL mode another process that then finds itself the last
#: user deletes the WAL these connections still read ("file is not a database").
_LOCK_FDS: dict[str, tuple[int, Any]] = {}
#: SQLite files this process has already found to be SQLite: their header is not read (opened and
#: closed) again while its connections may hold locks, for the same reason.
_KNOWN_SQLITE: set[str] = set()


def lock_handle(path: Path) -> tuple[int, Any]:
    """This process's descriptor of ``path`` for flock, and a lock for its threads (opened once per file;
    the descriptors of files since deleted or replaced are closed: no lock of a live file is dropped)."""
    import threading

    for name, (fd, _) in list(_LOCK_FDS.items()):
        try:
            gone = os.fstat(fd).st_ino != os.stat(name).st_ino
        except OSError:  # deleted
            gone = True
        if gone:
            os.close(fd)
            del _LOCK_FDS[name]
    name = str(path.resolve())
    if name not in _LOCK_FDS:
        _LOCK_FDS[name] = (os.open(name, os.O_RDONLY), threading.Lock())
    return _LOCK_FDS[name]


def sqlite_file(parsed: Any) -> Path | None:
    """The file of a parsed SQLite URL, or None (another backend, an in-memory database)."""
    if parsed.get_backend_name() != "sqlite":
        return None
    name = parsed.database
    if not name or name == ":memory:" or name.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(name)


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` (and its folder's journal files), or create it."""
    folder = path.parent if path.parent.exists() else next(p for p in path.parents if p.exists())
    return os.access(folder, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def check_writable(path: Path) -> None:
    """``DatabaseError`` when ``path`` (or its folder) cannot be written: tuning and import need it."""
    if not _writable(path):
        raise DatabaseError(
            f"{path}: read-only (the file, its folder or the filesystem cannot be written); read commands "
            "(show, export) still work, tuning and import need a writable --db"
        )


def read_only_connector(path: Path):
    """A connection factory for reading ``path`` without writing anything: ``query_only`` on a connection
    that cannot create the file (``mode=rw``: a ``mode=ro`` connection to a WAL database leaves empty
    -wal/-shm files behind, which the last ``rw`` connection removes when it closes); ``mode=ro`` with
    ``immutable=1`` where the folder cannot be written (a read-only filesystem: no -shm/-wal files can be
    made there, and nobody can be writing the file)."""
    mode = "rw" if _writable(path) else "ro&immutable=1"
    uri = f"file:{quote(str(path.resolve()))}?mode={mode}"

    def connect() -> sqlite3.Connection:
        con = sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False)
        con.execute("PRAGMA query_only = 1")
        return con

    return connect


def precheck_sqlite_file(path: Path) -> None:
    """Check an existing SQLite file read-only, before any engine could write to it."""
    if path.is_dir():
        raise DatabaseError(f"{path}: is a directory, not a database file")
    if not path.exists() or path.stat().st_size == 0:
        return
    known = str(path.resolve())
    if known not in _KNOWN_SQLITE:  # see _KNOWN_SQLITE: read once, before this process connects
        try:
            with path.open("rb") as f:
                header = f.read(len(_SQLITE_MAGIC))
        except OSError as e:
            raise DatabaseError(f"{path}: cannot read: {e.strerror or e}") from None
        if header != _SQLITE_MAGIC:
            raise DatabaseError(
                f"{path}: not an SQLite database (corrupt or another kind of file); it was left untouched. "
                "Move it away or pass another --db."
            )
    # Not mode=ro, since a read-only connection to a WAL database leaves -wal/-shm files behind;
    # query_only guarantees no write, and closing removes the (empty) WAL files again (mode=ro and
    # immutable only where nothing can write: read_only_connector).
    try:
        con = read_only_connector(path)()
    except sqlite3.Error as e:
        raise DatabaseError(f"{path}: cannot open: {e}") from None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        revs = []
        if VERSION_TABLE in tables:
            revs = [r[0] for r in con.execute(f"SELECT version_num FROM {VERSION_TABLE}")]
    except sqlite3.DatabaseError as e:
        raise DatabaseError(f"{path}: corrupt SQLite database ({e}); it was left untouched") from None
    finally:
        con.close()
    _migrate.check_known(revs, str(path))
    _migrate.check_owned(tables, tuple(revs), str(path))
    _KNOWN_SQLITE.add(known)


def mark_known(path: Path) -> None:
    """Remember that ``path`` is SQLite (made so, or checked): its header is never read again."""
    _KNOWN_SQLITE.add(str(path.resolve()))


def _ensure_wal(cur) -> None:
    """Switch the file to WAL (persistent in the file) unless it already is.

    Changing the journal mode needs an exclusive lock and SQLite answers SQLITE_BUSY at once, without the
    busy handler, while another process holds the file; so the switch is retried up to the busy timeout.
    """
    if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def serialize_sqlite_transactions(engine: Engine) -> None:
    """Make ``engine`` (Optuna's) begin every transaction ``IMMEDIATE``, as autotaxer's engine does: a
    read-then-write (taking a queued trial) then holds the write lock from its read on."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections made before the listeners: replaced by new ones


def make_engine(url: str, sqlite: bool, creator: Any = None) -> Engine:
    """The engine of ``url``: on SQLite WAL mode, a busy timeout and ``BEGIN IMMEDIATE`` (with ``creator``:
    its read-only connections, nothing switched)."""
    if not sqlite:
        return create_engine(url, pool_pre_ping=True)
    if creator is not None:  # read-only: the connections are made read-only; no WAL switch, no locks
        return create_engine(url, creator=creator)
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Let SQLAlchemy (not the driver) decide when transactions begin, so BEGIN IMMEDIATE, DDL
        # inside transactions and SAVEPOINTs all work (SQLAlchemy's documented pysqlite recipe).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _ensure_wal(cur)
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        # Take the write lock up front: a deferred transaction that reads and then writes fails with
        # SQLITE_BUSY (without waiting) when another process committed in between.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
