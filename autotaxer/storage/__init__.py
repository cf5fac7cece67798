"""The tuning database (SQLAlchemy + Alembic). Re-exports only.

``DatabaseError`` and ``default_url`` are light; ``open_database`` and ``Database`` import SQLAlchemy
on first access, so ``import autotaxer.storage`` stays cheap for the CLI and dispatch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._url import DatabaseError, MissingDatabase, default_url

if TYPE_CHECKING:
    from .database import Database, open_database

__all__ = ["Database", "DatabaseError", "MissingDatabase", "default_url", "open_database"]


def __getattr__(name: str) -> Any:
    if name in ("Database", "open_database"):
        from . import database

        return getattr(database, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
