"""Shapes that dispatch served without an exact tuned record, and the shapes.csv to tune them next.

Each runtime keeps its distinct misses in memory (``Runtime.misses()``) and, at shutdown, rank 0 appends
them as JSON lines to ``$AUTOTAXER_MISSES`` (default ``$XDG_DATA_HOME/autotaxer/misses.jsonl``). A line
is one miss of one run with its call count; :func:`read_misses` sums the counts per problem key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .._json_object import parse_json_object
from .._problem import ProblemKey

#: Environment variable naming the misses file.
MISSES_ENV = "AUTOTAXER_MISSES"


class MissesFileError(ValueError):
    """A misses file that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class Miss:
    """One problem key served by a nearest record or by the fallback, and how often it was called."""

    key: ProblemKey
    source: str  # "nearest" | "fallback"
    variant: str
    calls: int = 1
    tuned_key: str | None = None

    def to_dict(self) -> dict:
        return {
            "key": self.key.text,
            "source": self.source,
            "variant": self.variant,
            "calls": self.calls,
            "tuned_key": self.tuned_key,
        }


def default_misses_path() -> Path:
    """``$AUTOTAXER_MISSES``, else ``$XDG_DATA_HOME/autotaxer/misses.jsonl`` (``~/.local/share``)."""
    env = os.environ.get(MISSES_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "autotaxer" / "misses.jsonl"


def append_misses(misses: Iterable[Miss], path: str | os.PathLike) -> int:
    """Append one JSON line per miss to ``path`` in a single write; returns the number written."""
    stamp = datetime.now(timezone.utc).isoformat()
    lines = [json.dumps({**m.to_dict(), "recorded_at": stamp}, sort_keys=True) + "\n" for m in misses]
    if not lines:
        return 0
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, "".join(lines).encode())
    finally:
        os.close(fd)
    return len(lines)


def _field(obj: dict, name: str, kind: type, where: str):
    if name not in obj:
        raise MissesFileError(f"{where}: field {name!r}: missing")
    value = obj[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MissesFileError(f"{where}: field {name!r}: expected {kind.__name__}, got {value!r}")
    return value


def read_misses(path: str | os.PathLike) -> list[Miss]:
    """Distinct misses in ``path`` with call counts summed, most called first (empty if no file)."""
    p = Path(path)
    if not p.exists():
        return []
    merged: dict[ProblemKey, Miss] = {}
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise MissesFileError(f"{p}: not a text file ({e.reason})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        obj = parse_json_object(line, p, MissesFileError, line=lineno)
        try:
            key = ProblemKey.from_text(_field(obj, "key", str, where))
        except ValueError as e:
            if isinstance(e, MissesFileError):
                raise
            raise MissesFileError(f"{where}: field 'key': {e}") from None
        calls = _field(obj, "calls", int, where)
        if calls < 0:
            raise MissesFileError(f"{where}: field 'calls': must not be negative, got {calls}")
        tuned = obj.get("tuned_key")
        if tuned is not None and not isinstance(tuned, str):
            raise MissesFileError(f"{where}: field 'tuned_key': expected str or null, got {tuned!r}")
        source, variant = _field(obj, "source", str, where), _field(obj, "variant", str, where)
        old = merged.get(key)
        merged[key] = Miss(key, source, variant, calls + (old.calls if old else 0), tuned)
    return sorted(merged.values(), key=lambda m: (-m.calls, m.key.text))


def write_shapes_csv(misses: Iterable[Miss], path: str | os.PathLike, op: str | None = None) -> int:
    """Write the distinct shapes among ``misses`` (only ``op``'s where given; None: every op's) as a
    shapes.csv for ``autotaxer tune`` (most called first); returns the row count. See
    :func:`autotaxer.shapes.write_shapes`."""
    from ..shapes import write_shapes

    return write_shapes((m.key for m in misses), path, op)
