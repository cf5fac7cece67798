"""Optuna's RDB storage on the tuning database (its tables sit beside autotaxer's): opened under a lock
shared by every process using the database, checked against the installed Optuna before anything is
migrated, its SQLite transactions begun ``IMMEDIATE`` like autotaxer's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from ._engine import (
    SQLITE_BUSY_TIMEOUT_S,
    lock_handle,
    read_only_connector,
    serialize_sqlite_transactions,
    sqlite_file,
)
from ._url import DatabaseError

#: PostgreSQL advisory-lock id held while Optuna's schema is created (autotaxer's migrations use 2087413).
_OPTUNA_SCHEMA_LOCK = 2087414


def open_storage(db: Any) -> Any:
    """Optuna's RDB storage on the same database (its tables sit beside autotaxer's).

    Optuna creates its tables and stamps its schema version the first time; that runs under a lock
    held across processes (an advisory lock on the SQLite file, or PostgreSQL's advisory lock), so
    tuners started at once on a new database neither collide nor fail. On SQLite its transactions
    begin ``IMMEDIATE`` like autotaxer's, so two tuners never take the same queued trial. A schema
    written by a newer Optuna is refused by name.
    """
    import optuna

    sqlite = db.engine.dialect.name == "sqlite"
    kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if sqlite else {}
    if db.read_only:  # only Optuna's existing tables are read; none: no studies (None)
        with db.errors(), db.engine.connect() as conn:
            if "studies" not in inspect(conn).get_table_names():
                return None
        kwargs = {"creator": db.creator} if db.creator is not None else {}
        try:
            return optuna.storages.RDBStorage(db.url, engine_kwargs=kwargs, skip_table_creation=True)
        except RuntimeError as e:
            raise _mismatch(db, e) from None
    with schema_lock(db):
        try:
            storage = optuna.storages.RDBStorage(db.url, engine_kwargs=kwargs)
        except RuntimeError as e:  # Optuna's schema check: the tables were written by another version
            raise _mismatch(db, e) from None
        except sa_exc.DBAPIError as e:
            raise DatabaseError(f"{db.display_url}: {e.orig}") from e
        if sqlite:
            try:
                _complete_indexes(storage.engine)
            except sa_exc.IntegrityError as e:
                raise DatabaseError(
                    f"{db.display_url}: Optuna's tables hold one key twice ({e.orig}): a tuner was "
                    "killed while it created them, before their unique index. Export its winners "
                    "(autotaxer export) and tune into a new --db"
                ) from None
    if sqlite:
        serialize_sqlite_transactions(storage.engine)
    return storage


def check_schema(db: Any, tables: set[str]) -> None:
    """Refuse, before migrating autotaxer's tables, Optuna's tables written by another Optuna (the
    check :func:`open_storage` makes later, here through a connection that cannot write)."""
    if not {"studies", "alembic_version", "version_info"} <= tables:
        return  # none yet (Optuna creates them at head) or not Optuna's: open_storage() tells
    import optuna

    path = sqlite_file(make_url(db.url))
    kwargs = {"creator": read_only_connector(path)} if path is not None else {}
    try:
        storage = optuna.storages.RDBStorage(
            db.url, engine_kwargs=kwargs, skip_table_creation=True, skip_compatibility_check=True
        )
        try:
            current, head = storage.get_current_version(), storage.get_head_version()
        finally:
            storage.engine.dispose()
    except (sa_exc.DBAPIError, AssertionError):
        return  # an unusual Optuna schema (no revision stamped): open_storage() reports it as before
    if current != head:
        raise _mismatch(db, f"their schema is {current}, this optuna's {head}")


def _mismatch(db: Any, error: Exception | str) -> DatabaseError:
    import optuna

    return DatabaseError(
        f"{db.display_url}: Optuna's tables do not fit the installed optuna {optuna.__version__} "
        f"({error}); the database was not modified"
    )


@contextmanager
def schema_lock(db: Any) -> Iterator[None]:
    """Hold a lock shared by every process using this database (SQLite file, PostgreSQL)."""
    name = db.engine.dialect.name
    if name == "postgresql":
        with db.engine.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({_OPTUNA_SCHEMA_LOCK})")
            try:
                yield
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_OPTUNA_SCHEMA_LOCK})")
        return
    path = sqlite_file(make_url(db.url)) if name == "sqlite" else None
    if path is None or not path.exists():
        yield
        return
    import fcntl

    fd, lock = lock_handle(path)
    with lock:  # the threads of this process (flock does not tell them apart: one descriptor)
        fcntl.flock(fd, fcntl.LOCK_EX)  # advisory, and separate from SQLite's own (fcntl) locks
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _complete_indexes(engine: Any) -> None:
    """Create the indexes of Optuna's tables that are missing. SQLite runs each statement of Optuna's
    schema creation in its own transaction, so a process killed between a ``CREATE TABLE`` and its
    ``CREATE UNIQUE INDEX`` left a ``studies`` table without its unique study name: the next tuners then
    created one study twice and every later run failed to load it. Runs under the schema lock."""
    from optuna.storages._rdb import models

    for table in models.BaseModel.metadata.sorted_tables:
        for index in table.indexes:
            index.create(bind=engine, checkfirst=True)
