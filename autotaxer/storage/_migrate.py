"""Drive autotaxer's Alembic migrations from code (no alembic.ini): revisions, checks, upgrade; and
whether a database's tables are autotaxer's at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._url import DatabaseError
from .models import VERSION_TABLE, WinnerRow


def alembic_config(connection: Any = None, url: str | None = None):
    """An Alembic ``Config`` whose scripts are the installed ``autotaxer.migrations`` package."""
    from alembic.config import Config

    from autotaxer import migrations

    cfg = Config()
    location = str(Path(migrations.__file__).resolve().parent)
    cfg.set_main_option("script_location", location.replace("%", "%%"))
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def script_directory():
    """Alembic's view of the migration scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision this code knows (a single head; ``tests/storage/test_migrations.py`` checks it)."""
    heads = script_directory().get_heads()
    if len(heads) != 1:
        raise DatabaseError(
            f"autotaxer migrations have {len(heads)} heads ({', '.join(heads)}); expected one"
        )
    return heads[0]


def known_revisions() -> set[str]:
    """Every revision id of autotaxer's migrations."""
    return {s.revision for s in script_directory().walk_revisions()}


def current_revisions(connection: Any) -> tuple[str, ...]:
    """Revisions recorded in the database's ``autotaxer_alembic_version`` table (empty: none)."""
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return tuple(ctx.get_current_heads())


def check_known(revisions: tuple[str, ...] | list[str], where: str) -> None:
    """``DatabaseError`` when the database is at a revision this code does not know (a newer autotaxer)."""
    known = known_revisions()
    unknown = [r for r in revisions if r not in known]
    if unknown:
        raise DatabaseError(
            f"{where}: schema revision {unknown[0]!r} is unknown to this autotaxer (newest known: "
            f"{head_revision()}); the database was written by a newer autotaxer: upgrade autotaxer. "
            "The database was not modified."
        )
    if len(revisions) > 1:
        raise DatabaseError(f"{where}: database has several schema revisions ({', '.join(revisions)})")


def upgrade(connection: Any, target: str = "head") -> None:
    """Run migrations up to ``target`` on ``connection`` (inside the caller's transaction, if any)."""
    from alembic import command

    command.upgrade(alembic_config(connection), target)


def downgrade(connection: Any, target: str = "base") -> None:
    """Run migrations down to ``target`` on ``connection``."""
    from alembic import command

    command.downgrade(alembic_config(connection), target)


#: Tables that mark a database as autotaxer's (with its version table).
_OWN_TABLES = frozenset({WinnerRow.__tablename__, VERSION_TABLE})


def check_owned(tables: set[str], revs: tuple[str, ...] | list[str], where: str) -> None:
    """Refuse, untouched, a database that holds tables but is not autotaxer's (another application's,
    or autotaxer's tables without their schema version)."""
    if not tables:
        return  # new and empty: autotaxer's to create
    if WinnerRow.__tablename__ in tables and not revs:
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
