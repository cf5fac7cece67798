"""The tuning database: open (checking and migrating the schema), and read/write winners.

SQLite (the default) runs in WAL mode with a busy timeout, and every transaction starts with
``BEGIN IMMEDIATE`` so concurrent tuners queue for the write lock instead of failing; other backends
(PostgreSQL, ...) work through any SQLAlchemy URL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, insert, inspect, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from .._problem import ProblemKey
from ..records import WinnerRecord, timing_of, to_utc
from . import _claims, _migrate
from ._claims import Claim
from ._url import DatabaseError, MissingDatabase, default_url
from .models import VERSION_TABLE, WinnerRow, key_match

#: Seconds a writer waits for SQLite's write lock before giving up.
SQLITE_BUSY_TIMEOUT_S = 30.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
_RACE_RETRIES = 5
_WINNERS = WinnerRow.__table__
#: PostgreSQL advisory-lock id held while Optuna's schema is created (autotaxer's migrations use 2087413).
_OPTUNA_SCHEMA_LOCK = 2087414
_LIMITS = {"op": 64, "gpu_model": 128, "dtype": 16, "shape": 255, "layout": 255, "variant": 64, "arch": 64}


def open_database(url: str | None = None, upgrade: bool = True, read_only: bool = False) -> Database:
    """Open the tuning database at ``url`` (default: :func:`default_url`), migrating it to head.

    ``read_only`` (show, export, dispatch, reports): nothing is ever written, created or switched
    (SQLite is opened ``query_only``, and ``mode=ro``, ``immutable`` where its file cannot be written,
    e.g. on a read-only filesystem; no -wal/-shm file is left beside it); a missing file is
    :class:`MissingDatabase`. Raises :class:`DatabaseError` (leaving the file untouched) when it is not a
    database, not autotaxer's, written by a newer autotaxer or Optuna (checked before any migration), or
    (to write) not writable.
    """
    url = url or default_url()
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as e:
        raise DatabaseError(f"--db {url!r}: not a valid SQLAlchemy URL ({e})") from None
    shown = parsed.render_as_string(hide_password=True)
    path = _sqlite_file(parsed)
    creator = None
    if path is not None:
        if read_only and not path.exists():
            raise MissingDatabase(f"{path}: no tuning database there yet (autotaxer tune creates it)")
        _precheck_sqlite_file(path)
        if read_only:
            creator = _read_only_connector(path)
        else:
            _check_writable(path)
            path.parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = _create_engine(url, sqlite=parsed.get_backend_name() == "sqlite", creator=creator)
    except Exception as e:  # missing driver, bad options
        raise DatabaseError(f"{shown}: cannot create an engine: {e}") from None
    db = Database(url, engine, read_only=read_only, creator=creator)
    try:
        db._check_and_upgrade(upgrade and not read_only)
    except BaseException:
        db.close()
        raise
    if path is not None and path.exists():
        _KNOWN_SQLITE.add(str(path.resolve()))  # SQLite now (made so, or checked): never read raw again
    return db


class Database:
    """An open tuning database. Use :func:`open_database` to create one."""

    def __init__(self, url: str, engine: Engine, read_only: bool = False, creator: Any = None) -> None:
        self.url = url
        self.engine = engine
        self.read_only = read_only
        self._creator = creator  # SQLite read-only connections
        self.display_url = make_url(url).render_as_string(hide_password=True)
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    # -- schema ---------------------------------------------------------------------------------
    def current_revision(self) -> str | None:
        """The schema revision recorded in the database (None before the first migration)."""
        with self._errors(), self.engine.connect() as conn:
            revs = _migrate.current_revisions(conn)
        return revs[0] if revs else None

    def _check_and_upgrade(self, upgrade: bool) -> None:
        with self._errors(), self.engine.connect() as conn:
            revs = _migrate.current_revisions(conn)
            tables = set(inspect(conn).get_table_names())
        _migrate.check_known(revs, self.display_url)
        _check_owned(tables, revs, self.display_url)
        if not upgrade or revs == (_migrate.head_revision(),):
            return
        self._check_optuna_schema(tables)  # everything checked before anything is migrated
        with self._errors(), self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Two processes opening a new database at once: one migrates, the other waits.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(2087413)")
            # Re-read inside the (write-locked) transaction: a racing process may have migrated.
            revs = _migrate.current_revisions(conn)
            _migrate.check_known(revs, self.display_url)
            _migrate.upgrade(conn, "head")

    # -- transactions ---------------------------------------------------------------------------
    @contextmanager
    def session_scope(self) -> Iterator[Session]:
        """A session that commits when the block succeeds and rolls back when it raises."""
        session = self._sessions()
        try:
            with self._errors():
                yield session
                session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn driver errors (other than key conflicts) into :class:`DatabaseError` naming the URL."""
        try:
            yield
        except sa_exc.IntegrityError:
            raise
        except sa_exc.DBAPIError as e:
            raise DatabaseError(f"{self.display_url}: {e.orig}") from e

    # -- winners --------------------------------------------------------------------------------
    def upsert_winner(self, rec: WinnerRecord, replace: bool = False) -> bool:
        """Store ``rec`` unless a faster record of its key, timed the same way, exists (``replace``: always).

        True if written. A stored record timed in another mode (``env["timing"]``: eager or graph) is
        replaced: medians of different modes do not compare."""
        written, _ = self.upsert_winners([rec], replace=replace)
        return written == 1

    def upsert_winners(self, recs: Iterable[WinnerRecord], replace: bool = False) -> tuple[int, int]:
        """Store many records in ONE transaction (all or nothing); returns ``(written, kept)``."""
        recs = list(recs)
        written = 0
        with self.session_scope() as session:
            for rec in recs:
                written += self._write_one(session, rec, replace)
        return written, len(recs) - written

    def _write_one(self, session: Session, rec: WinnerRecord, replace: bool) -> bool:
        values = _row_values(rec)
        match = _key_clause(rec.key)
        if not replace:
            # Times measured in different modes (eager back-to-back vs CUDA-graph replay) do not compare:
            # a record of another mode is replaced, never kept for being "faster".
            stored = session.execute(select(_WINNERS.c.env).where(match)).scalar_one_or_none()
            replace = stored is not None and timing_of(json.loads(stored)) != timing_of(rec.env)
        for _ in range(_RACE_RETRIES):
            now = datetime.now(timezone.utc)
            # A conditional UPDATE is atomic, so two writers of one key always keep the faster record.
            stmt = update(_WINNERS).where(match).values(**values, updated_at=now)
            if not replace:
                stmt = stmt.where(_WINNERS.c.median_us > rec.median_us)
            if session.execute(stmt).rowcount:
                return True
            if session.execute(select(_WINNERS.c.id).where(match)).first() is not None:
                return False  # the stored record is at least as fast
            try:
                with session.begin_nested():
                    session.execute(insert(_WINNERS).values(**values, created_at=now, updated_at=now))
                return True
            except sa_exc.IntegrityError:
                time.sleep(0.01)  # a racing process inserted this key: compare against its record
        raise DatabaseError(f"{self.display_url}: could not store {rec.key.text} after {_RACE_RETRIES} tries")

    def get_winner(self, key: ProblemKey) -> WinnerRecord | None:
        """The stored winner of ``key``, or None."""
        with self.session_scope() as session:
            row = session.execute(select(_WINNERS).where(_key_clause(key))).mappings().first()
            return None if row is None else _to_record(row)

    def winners(
        self, op: str | None = None, gpu_model: str | None = None, world_size: int | None = None
    ) -> list[WinnerRecord]:
        """Stored winners matching the filters, ordered by key (shapes numerically)."""
        stmt = select(_WINNERS)
        if op is not None:
            stmt = stmt.where(_WINNERS.c.op == op)
        if gpu_model is not None:
            stmt = stmt.where(_WINNERS.c.gpu_model == gpu_model)
        if world_size is not None:
            stmt = stmt.where(_WINNERS.c.world_size == world_size)
        with self.session_scope() as session:
            recs = [_to_record(row) for row in session.execute(stmt).mappings()]
        return sorted(recs, key=lambda r: _sort_key(r.key))

    def delete_winner(self, key: ProblemKey) -> bool:
        """Remove the winner of ``key`` (``--retune``); True when there was one."""
        with self.session_scope() as session:
            return bool(session.execute(_WINNERS.delete().where(_key_clause(key))).rowcount)

    # -- claims: one tuner at a time per key (``._claims``) -------------------------------------------
    def claim(self, key: ProblemKey, owner: str, abandoned: Callable[[Claim], bool]) -> Claim:
        """Take the claim on ``key`` for ``owner`` if it is free, ``owner``'s or ``abandoned``; the claim
        as it stands after the attempt (its ``owner`` says who tunes ``key``)."""
        return _claims.acquire(self, key, owner, abandoned)

    def renew_claim(self, key: ProblemKey, owner: str) -> bool:
        """Refresh ``owner``'s heartbeat on ``key``; False when the claim is no longer ``owner``'s."""
        return _claims.renew(self, key, owner)

    def release_claim(self, key: ProblemKey, owner: str) -> bool:
        """Drop ``owner``'s claim on ``key``; True when there was one."""
        return _claims.release(self, key, owner)

    def claim_of(self, key: ProblemKey) -> Claim | None:
        """Who tunes ``key`` now, or None."""
        return _claims.holder(self, key)

    def optuna_storage(self):
        """Optuna's RDB storage on the same database (its tables sit beside autotaxer's).

        Optuna creates its tables and stamps its schema version the first time; that runs under a lock
        held across processes (an advisory lock on the SQLite file, or PostgreSQL's advisory lock), so
        tuners started at once on a new database neither collide nor fail. On SQLite its transactions
        begin ``IMMEDIATE`` like autotaxer's, so two tuners never take the same queued trial. A schema
        written by a newer Optuna is refused by name.
        """
        import optuna

        sqlite = self.engine.dialect.name == "sqlite"
        kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if sqlite else {}
        if self.read_only:  # only Optuna's existing tables are read; none: no studies (None)
            with self._errors(), self.engine.connect() as conn:
                if "studies" not in inspect(conn).get_table_names():
                    return None
            kwargs = {"creator": self._creator} if self._creator is not None else {}
            try:
                return optuna.storages.RDBStorage(self.url, engine_kwargs=kwargs, skip_table_creation=True)
            except RuntimeError as e:
                raise self._optuna_mismatch(e) from None
        with self._schema_lock():
            try:
                storage = optuna.storages.RDBStorage(self.url, engine_kwargs=kwargs)
            except RuntimeError as e:  # Optuna's schema check: the tables were written by another version
                raise self._optuna_mismatch(e) from None
            except sa_exc.DBAPIError as e:
                raise DatabaseError(f"{self.display_url}: {e.orig}") from e
            if sqlite:
                try:
                    _complete_optuna_indexes(storage.engine)
                except sa_exc.IntegrityError as e:
                    raise DatabaseError(
                        f"{self.display_url}: Optuna's tables hold one key twice ({e.orig}): a tuner was "
                        "killed while it created them, before their unique index. Export its winners "
                        "(autotaxer export) and tune into a new --db"
                    ) from None
        if sqlite:
            _serialize_sqlite_transactions(storage.engine)
        return storage

    def _check_optuna_schema(self, tables: set[str]) -> None:
        """Refuse, before migrating autotaxer's tables, Optuna's tables written by another Optuna (the
        check :meth:`optuna_storage` makes later, here through a connection that cannot write)."""
        if not {"studies", "alembic_version", "version_info"} <= tables:
            return  # none yet (Optuna creates them at head) or not Optuna's: optuna_storage() tells
        import optuna

        path = _sqlite_file(make_url(self.url))
        kwargs = {"creator": _read_only_connector(path)} if path is not None else {}
        try:
            storage = optuna.storages.RDBStorage(
                self.url, engine_kwargs=kwargs, skip_table_creation=True, skip_compatibility_check=True
            )
            try:
                current, head = storage.get_current_version(), storage.get_head_version()
            finally:
                storage.engine.dispose()
        except (sa_exc.DBAPIError, AssertionError):
            return  # an unusual Optuna schema (no revision stamped): optuna_storage() reports it as before
        if current != head:
            raise self._optuna_mismatch(f"their schema is {current}, this optuna's {head}")

    def _optuna_mismatch(self, error: Exception | str) -> DatabaseError:
        import optuna

        return DatabaseError(
            f"{self.display_url}: Optuna's tables do not fit the installed optuna {optuna.__version__} "
            f"({error}); the database was not modified"
        )

    @contextmanager
    def _schema_lock(self) -> Iterator[None]:
        """Hold a lock shared by every process using this database (SQLite file, PostgreSQL)."""
        name = self.engine.dialect.name
        if name == "postgresql":
            with self.engine.connect() as conn:
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({_OPTUNA_SCHEMA_LOCK})")
                try:
                    yield
                finally:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_OPTUNA_SCHEMA_LOCK})")
            return
        path = _sqlite_file(make_url(self.url)) if name == "sqlite" else None
        if path is None or not path.exists():
            yield
            return
        import fcntl

        fd, lock = _lock_handle(path)
        with lock:  # the threads of this process (flock does not tell them apart: one descriptor)
            fcntl.flock(fd, fcntl.LOCK_EX)  # advisory, and separate from SQLite's own (fcntl) locks
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


# -- helpers ------------------------------------------------------------------------------------


#: Descriptors of SQLite files this process flocks (:meth:`Database._schema_lock`), never closed: closing
#: any descriptor of a database file drops every POSIX lock this process's SQLite connections hold on it
#: (sqlite.org/howtocorrupt.html, 2.2), and in WAL mode another process that then finds itself the last
#: user deletes the WAL these connections still read ("file is not a database").
_LOCK_FDS: dict[str, tuple[int, Any]] = {}
#: SQLite files this process has already found to be SQLite: their header is not read (opened and
#: closed) again while its connections may hold locks, for the same reason.
_KNOWN_SQLITE: set[str] = set()


def _lock_handle(path: Path) -> tuple[int, Any]:
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


def _sqlite_file(parsed) -> Path | None:
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


def _check_writable(path: Path) -> None:
    if not _writable(path):
        raise DatabaseError(
            f"{path}: read-only (the file, its folder or the filesystem cannot be written); read commands "
            "(show, export) still work, tuning and import need a writable --db"
        )


def _read_only_connector(path: Path):
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


def _precheck_sqlite_file(path: Path) -> None:
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
    # immutable only where nothing can write: _read_only_connector).
    try:
        con = _read_only_connector(path)()
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
    _check_owned(tables, tuple(revs), str(path))
    _KNOWN_SQLITE.add(known)


#: Tables that mark a database as autotaxer's (with its version table).
_OWN_TABLES = frozenset({_WINNERS.name, VERSION_TABLE})
#: Optuna's tables: a database holding only these is an Optuna storage, not autotaxer's.
_OPTUNA_TABLES = frozenset({"studies", "trials", "alembic_version", "version_info"})


def _check_owned(tables: set[str], revs: tuple[str, ...] | list[str], where: str) -> None:
    """Refuse, untouched, a database that holds tables but is not autotaxer's (another application's,
    or autotaxer's tables without their schema version)."""
    if not tables:
        return  # new and empty: autotaxer's to create
    if _WINNERS.name in tables and not revs:
        raise DatabaseError(
            f"{where}: autotaxer's tables are there but their schema version is not "
            f"({VERSION_TABLE} missing or empty); it was left untouched. Restore that table or move the "
            "database away"
        )
    if not tables & _OWN_TABLES:
        others = sorted(tables)
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise DatabaseError(
            f"{where}: not an autotaxer database (it holds the tables {shown}); it was left untouched. "
            "Pass another --db"
        )


def _ensure_wal(cur) -> None:
    """Switch the file to WAL (persistent in the file) unless it already is.

    Changing the journal mode needs an exclusive lock and SQLite answers SQLITE_BUSY at once, without the
    busy handler, while another process holds the file; so the switch is retried up to the busy timeout.
    """
    import sqlite3
    import time

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


def _complete_optuna_indexes(engine: Engine) -> None:
    """Create the indexes of Optuna's tables that are missing. SQLite runs each statement of Optuna's
    schema creation in its own transaction, so a process killed between a ``CREATE TABLE`` and its
    ``CREATE UNIQUE INDEX`` left a ``studies`` table without its unique study name: the next tuners then
    created one study twice and every later run failed to load it. Runs under the schema lock."""
    from optuna.storages._rdb import models

    for table in models.BaseModel.metadata.sorted_tables:
        for index in table.indexes:
            index.create(bind=engine, checkfirst=True)


def _serialize_sqlite_transactions(engine: Engine) -> None:
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


def _create_engine(url: str, sqlite: bool, creator: Any = None) -> Engine:
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


def _key_clause(key: ProblemKey):
    return key_match(_WINNERS, key)


def _row_values(rec: WinnerRecord) -> dict[str, Any]:
    k = rec.key
    env = dict(rec.env)
    values = {
        "op": k.op,
        "gpu_model": k.gpu_model,
        "world_size": k.world_size,
        "dtype": k.dtype,
        "shape": k.shape_text,
        "layout": k.layout_text,
        "variant": rec.variant,
        "params": json.dumps(dict(rec.params), allow_nan=False),
        "median_us": rec.median_us,
        "bsp_us": rec.bsp_us,
        "speedup": rec.speedup,
        "trials": rec.trials,
        "device_type": rec.device_type,
        "arch": rec.arch,
        "num_sms": rec.num_sms,
        "kernel_hash": rec.kernel_hash,
        "torch_version": _short(env.get("torch")),
        "triton_version": _short(env.get("triton")),
        "iris_version": _short(env.get("iris")),
        "driver_version": _short(env.get("cuda_or_hip")),
        "env": json.dumps(env),
        "measured_at": rec.measured_at,
    }
    for name, limit in _LIMITS.items():
        if len(values[name]) > limit:
            raise ValueError(f"{k.text}: field {name!r}: longer than {limit} characters")
    return values


def _short(value: str | None) -> str | None:
    return None if value is None else value[:64]


def _to_record(row: Any) -> WinnerRecord:
    key = ProblemKey.from_text(
        "|".join(
            [row["op"], row["gpu_model"], str(row["world_size"]), row["dtype"], row["shape"], row["layout"]]
        )
    )
    return WinnerRecord(
        key=key,
        variant=row["variant"],
        params=json.loads(row["params"]),
        median_us=row["median_us"],
        bsp_us=row["bsp_us"],
        trials=row["trials"],
        arch=row["arch"],
        num_sms=row["num_sms"],
        env=json.loads(row["env"]),
        kernel_hash=row["kernel_hash"],
        measured_at=to_utc(row["measured_at"]),
        device_type=row["device_type"],
    )


def _sort_key(key: ProblemKey) -> tuple:
    return (key.op, key.gpu_model, key.world_size, key.dtype, key.shape, key.layout)
