"""Alembic environment: runs autotaxer's migrations on the connection autotaxer hands in.

``autotaxer.storage._migrate`` builds the Alembic ``Config`` in Python and passes an open connection
in ``config.attributes["connection"]``; a URL (``sqlalchemy.url``) works too, e.g. for ``--sql``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from autotaxer.storage.models import TABLE_PREFIX, VERSION_TABLE, Base


def _include_name(name, type_, parent_names) -> bool:
    # Autogenerate compares only autotaxer's tables: Optuna's live in the same database.
    if type_ == "table":
        return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


def _configure(**options) -> None:
    context.configure(
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        transaction_per_migration=True,
        include_name=_include_name,
        **options,
    )


def run_migrations_offline() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    _configure(url=url, literal_binds=True, render_as_batch=str(url).startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _run_on(conn)
    finally:
        engine.dispose()


def _run_on(connection) -> None:
    # SQLite cannot ALTER most things in place: batch mode copies the table instead.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
