"""One JSON object parsed from a user's file, with errors that name the file and line."""

from __future__ import annotations

import json
from typing import Any


def parse_json_object(
    text: str, path: object, error: type[Exception], line: int | None = None
) -> dict[str, Any]:
    """``text`` parsed as a JSON object; otherwise ``error`` naming ``path`` and the line (and column) of
    the fault. ``line``: the file line ``text`` stands on (a line of a JSON-lines file); None: ``text`` is
    the whole file."""
    first = 1 if line is None else line
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{first + e.lineno - 1}: not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(doc, dict):
        where = path if line is None else f"{path}:{line}"
        raise error(f"{where}: expected a JSON object, got {type(doc).__name__}")
    return doc
