"""Light part of the storage API: the default URL and the error type (no SQLAlchemy import)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "AUTOTAXER_DB"


class DatabaseError(RuntimeError):
    """The tuning database cannot be opened or used; the message says why and what to do."""


class MissingDatabase(DatabaseError):
    """A read found no database file at the path (nothing was created)."""


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/autotaxer/tuning.sqlite`` (``~/.local/share`` when XDG_DATA_HOME is unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "autotaxer" / "tuning.sqlite"


def default_url() -> str:
    """``$AUTOTAXER_DB`` when set, else an SQLite file under the user's data directory."""
    url = os.environ.get(ENV_VAR)
    if url:
        return url
    return f"sqlite:///{default_db_path()}"
