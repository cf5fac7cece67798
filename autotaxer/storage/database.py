"""The tuning database: open (checking and migrating the schema), and the :class:`Database` every reader
and writer goes through.

SQLite (the default) runs in WAL mode with a busy timeout, and every transaction starts with
``BEGIN IMMEDIATE`` so concurrent tuners queue for the write lock instead of failing (:mod:`._engine`);
other backends (PostgreSQL, ...) work through any SQLAlchemy URL. The winners table is
:mod:`._winners`, the claims :mod:`._claims`, Optuna's storage beside them :mod:`._optuna`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from .._problem import ProblemKey
from ..records import WinnerRecord
from . import _claims, _engine, _migrate, _optuna, _winners
from ._claims import Claim
from ._url import DatabaseError, MissingDatabase, default_url


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
    path = _engine.sqlite_file(parsed)
    creator = None
    if path is not None:
        if read_only and not path.exists():
            raise MissingDatabase(f"{path}: no tuning database there yet (autotaxer tune creates it)")
        _engine.precheck_sqlite_file(path)
        if read_only:
            creator = _engine.read_only_connector(path)
        else:
            _engine.check_writable(path)
            path.parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = _engine.make_engine(url, sqlite=parsed.get_backend_name() == "sqlite", creator=creator)
    except Exception as e:  # missing driver, bad options
        raise DatabaseError(f"{shown}: cannot create an engine: {e}") from None
    db = Database(url, engine, read_only=read_only, creator=creator)
    try:
        db._check_and_upgrade(upgrade and not read_only)
    except BaseException:
        db.close()
        raise
    if path is not None and path.exists():
        _engine.mark_known(path)  # SQLite now (made so, or checked): never read raw again
    return db


class Database:
    """An open tuning database. Use :func:`open_database` to create one."""

    def __init__(self, url: str, engine: Engine, read_only: bool = False, creator: Any = None) -> None:
        self.url = url
        self.engine = engine
        self.read_only = read_only
        self.creator = creator  # SQLite read-only connections (Optuna's engine makes them too)
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
        with self.errors(), self.engine.connect() as conn:
            revs = _migrate.current_revisions(conn)
        return revs[0] if revs else None

    def _check_and_upgrade(self, upgrade: bool) -> None:
        with self.errors(), self.engine.connect() as conn:
            revs = _migrate.current_revisions(conn)
            tables = set(inspect(conn).get_table_names())
        _migrate.check_known(revs, self.display_url)
        _migrate.check_owned(tables, revs, self.display_url)
        if not upgrade or revs == (_migrate.head_revision(),):
            return
        _optuna.check_schema(self, tables)  # everything checked before anything is migrated
        with self.errors(), self.engine.begin() as conn:
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
            with self.errors():
                yield session
                session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Turn driver errors (other than key conflicts) into :class:`DatabaseError` naming the URL."""
        try:
            yield
        except sa_exc.IntegrityError:
            raise
        except sa_exc.DBAPIError as e:
            raise DatabaseError(f"{self.display_url}: {e.orig}") from e

    # -- winners (``._winners``) -------------------------------------------------------------------
    def upsert_winner(self, rec: WinnerRecord, replace: bool = False) -> bool:
        """Store ``rec`` unless a faster record of its key, timed the same way, exists (``replace``: always).

        True if written. A stored record timed in another mode (``env["timing"]``: eager or graph) is
        replaced: medians of different modes do not compare."""
        written, _ = self.upsert_winners([rec], replace=replace)
        return written == 1

    def upsert_winners(self, recs: Iterable[WinnerRecord], replace: bool = False) -> tuple[int, int]:
        """Store many records in ONE transaction (all or nothing); returns ``(written, kept)``."""
        return _winners.upsert(self, recs, replace)

    def get_winner(self, key: ProblemKey) -> WinnerRecord | None:
        """The stored winner of ``key``, or None."""
        return _winners.get(self, key)

    def winners(
        self, op: str | None = None, gpu_model: str | None = None, world_size: int | None = None
    ) -> list[WinnerRecord]:
        """Stored winners matching the filters, ordered by key (shapes numerically)."""
        return _winners.matching(self, op, gpu_model, world_size)

    def delete_winner(self, key: ProblemKey) -> bool:
        """Remove the winner of ``key`` (``--retune``); True when there was one."""
        return _winners.delete(self, key)

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

    # -- Optuna's storage (``._optuna``) -----------------------------------------------------------
    def optuna_storage(self) -> Any:
        """Optuna's RDB storage on the same database (its tables sit beside autotaxer's); None when read-only
        and Optuna's tables are not there (no studies). See :func:`._optuna.open_storage`."""
        return _optuna.open_storage(self)
