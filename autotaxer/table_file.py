"""Exported tuning tables: JSON (with a schema version) or CSV, data only.

Light module (json/csv only): dispatch reads tables through :func:`read_table` at start-up.

JSON layout::

    {"format": "autotaxer-tuning-table", "schema_version": 1, "exported_at": "...", "records": [...]}

CSV layout: a first line ``# autotaxer-tuning-table schema_version=1``, a header of
:data:`~autotaxer.records.RECORD_FIELDS`, one record per line (shape/layout as ``M=8,N=16``,
params/env as JSON objects).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from ._json_object import parse_json_object
from .output_file import write_atomic
from .records import RECORD_FIELDS, RecordError, WinnerRecord

TABLE_SCHEMA_VERSION = 1
TABLE_FORMAT = "autotaxer-tuning-table"
FORMATS: tuple[str, ...] = ("json", "csv")

_CSV_MAGIC_RE = re.compile(rf"^#\s*{TABLE_FORMAT}\s+schema_version=(\S*)\s*$")


class TableFileError(ValueError):
    """A table file that cannot be read; the message names the file, record/line and field."""


def table_format(path: str | os.PathLike[str], fmt: str | None = None) -> Literal["json", "csv"]:
    """The file format: ``fmt`` when given, else from the suffix (``.json`` or ``.csv``)."""
    name = fmt if fmt is not None else Path(path).suffix.lower().lstrip(".")
    if name not in FORMATS:
        source = f"format {fmt!r}" if fmt is not None else f"suffix of {os.fspath(path)!r}"
        raise TableFileError(f"{source}: expected one of {', '.join(FORMATS)}")
    return name  # type: ignore[return-value]


def write_table(
    records: Iterable[WinnerRecord],
    path: str | os.PathLike[str],
    fmt: Literal["json", "csv"] | None = None,
) -> int:
    """Write ``records`` to ``path`` atomically (temp file + rename); returns the number written.
    ``path`` must be a regular file or new (:func:`autotaxer.output_file.output_path`: a device, FIFO or
    folder is refused, a symlink written through); a new file's mode is ``0666`` less the umask."""
    kind = table_format(path, fmt)
    recs = list(records)
    text = _render_json(recs) if kind == "json" else _render_csv(recs)
    write_atomic(path, text)
    return len(recs)


def read_table(path: str | os.PathLike[str]) -> list[WinnerRecord]:
    """Read a JSON or CSV table; :class:`TableFileError` on any problem (nothing partial is returned)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TableFileError(f"{p}: cannot read: {e.strerror or e}") from None
    if b"\x00" in data:
        raise TableFileError(f"{p}: not a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TableFileError(f"{p}: not a text file (not UTF-8)") from None
    if not text.strip():
        raise TableFileError(f"{p}: empty file")
    suffix = p.suffix.lower()
    is_json = suffix == ".json" or (suffix != ".csv" and text.lstrip().startswith("{"))
    records = _parse_json(p, text) if is_json else _parse_csv(p, text)
    _check_unique(records)
    return [r for r, _ in records]


# -- writing -------------------------------------------------------------------------------------


def _render_json(records: list[WinnerRecord]) -> str:
    doc = {
        "format": TABLE_FORMAT,
        "schema_version": TABLE_SCHEMA_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "records": [r.to_dict() for r in records],
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def _render_csv(records: list[WinnerRecord]) -> str:
    buf = io.StringIO()
    buf.write(f"# {TABLE_FORMAT} schema_version={TABLE_SCHEMA_VERSION}\n")
    writer = csv.DictWriter(buf, fieldnames=list(RECORD_FIELDS), lineterminator="\n")
    writer.writeheader()
    for r in records:
        row = r.to_dict()
        row["shape"] = r.key.shape_text
        row["layout"] = r.key.layout_text
        row["params"] = json.dumps(row["params"], allow_nan=False)
        row["env"] = json.dumps(row["env"])
        row["median_us"] = repr(r.median_us)
        row["bsp_us"] = repr(r.bsp_us)
        row["speedup"] = repr(r.speedup)
        row["kernel_hash"] = "" if r.kernel_hash is None else r.kernel_hash
        writer.writerow(row)
    return buf.getvalue()


# -- reading -------------------------------------------------------------------------------------


def _parse_json(path: Path, text: str) -> list[tuple[WinnerRecord, str]]:
    doc = parse_json_object(text, path, TableFileError)
    if doc.get("format") != TABLE_FORMAT:
        raise TableFileError(
            f"{path}: field 'format': expected {TABLE_FORMAT!r}, got {doc.get('format')!r} "
            "(not an autotaxer tuning table)"
        )
    _check_version(path, doc.get("schema_version", None), "schema_version" in doc)
    raw = doc.get("records")
    if not isinstance(raw, list):
        raise TableFileError(f"{path}: field 'records': expected a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        where = f"{path}: record {i}"
        try:
            out.append((WinnerRecord.from_dict(item, where), where))
        except RecordError as e:
            raise TableFileError(str(e)) from None
    return out


def _parse_csv(path: Path, text: str) -> list[tuple[WinnerRecord, str]]:
    lines = text.splitlines()
    m = _CSV_MAGIC_RE.match(lines[0].strip())
    if m is None:
        raise TableFileError(
            f"{path}:1: missing schema version line '# {TABLE_FORMAT} schema_version={TABLE_SCHEMA_VERSION}'"
        )
    version_text = m.group(1)
    version = int(version_text) if version_text.isdigit() else version_text
    _check_version(path, version, True, line=1)
    if len(lines) < 2 or not lines[1].strip():
        raise TableFileError(f"{path}:2: missing header line")
    header = [h.strip() for h in next(csv.reader([lines[1]]))]
    unknown = [h for h in header if h not in RECORD_FIELDS]
    if unknown:
        raise TableFileError(f"{path}:2: field {unknown[0]!r}: unknown column")
    if len(set(header)) != len(header):
        raise TableFileError(f"{path}:2: duplicate column in header")
    out = []
    for lineno, line in enumerate(lines[2:], start=3):
        if not line.strip():
            continue
        try:
            values = next(csv.reader([line]))
        except csv.Error as e:
            raise TableFileError(f"{path}:{lineno}: not valid CSV: {e}") from None
        where = f"{path}:{lineno}"
        if len(values) != len(header):
            raise TableFileError(f"{where}: expected {len(header)} fields, got {len(values)}")
        row = dict(zip(header, values, strict=True))
        try:
            out.append((WinnerRecord.from_dict(row, where, text=True), where))
        except RecordError as e:
            raise TableFileError(str(e)) from None
    return out


def _check_version(path: Path, version: object, present: bool, line: int | None = None) -> None:
    where = f"{path}:{line}" if line is not None else str(path)
    if not present:
        raise TableFileError(f"{where}: field 'schema_version': missing")
    if version != TABLE_SCHEMA_VERSION or isinstance(version, bool):
        raise TableFileError(
            f"{where}: field 'schema_version': version {version!r} is not supported "
            f"(this autotaxer reads version {TABLE_SCHEMA_VERSION})"
        )


def _check_unique(records: list[tuple[WinnerRecord, str]]) -> None:
    seen: dict[object, str] = {}
    for r, where in records:
        if r.key in seen:
            raise TableFileError(
                f"{where}: field 'shape': duplicate problem key {r.key.text} ({seen[r.key]})"
            )
        seen[r.key] = where
