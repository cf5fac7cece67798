"""Shapes files: the problems to tune, one per CSV row.

A header names the columns: the op's shape fields (``M,N,K`` for ``ag_gemm``) are required; ``op``
(default ``ag_gemm``), ``dtype`` (default ``bf16``) and the op's layout fields (``gather_dim``, default
``0``; ``b_layout``, default ``kn``, or ``nk`` for nn.Linear's transposed weight) are optional. Blank
lines and lines starting with ``#`` are ignored. Every problem raises :class:`ShapesError` naming the
file, line and field; duplicate rows are warned about and dropped.
"""

from __future__ import annotations

import csv
import io
import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ._problem import DTYPES, IMPLICIT_LAYOUT, MAX_DIM, ProblemKey
from .ops import DEFAULT_OP

DEFAULT_DTYPE = "bf16"
_INT_RE = re.compile(r"^[+-]?[0-9]+$")


class ShapesError(ValueError):
    """A bad shapes file: ``.path``, ``.line`` (1-based, or None) and ``.field`` (or None)."""

    def __init__(self, path: str, line: int | None, field: str | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = path if line is None else f"{path}:{line}"
        what = f" field {field!r}:" if field is not None else ""
        super().__init__(f"{where}:{what} {problem}")


class DuplicateShapeWarning(UserWarning):
    """A shapes file row repeats an earlier one; the repeat is ignored."""


@dataclass(frozen=True)
class ShapeRow:
    """One problem of a shapes file (without GPU model and world size)."""

    op: str
    dtype: str
    shape: dict[str, int]
    layout: dict[str, int | str]
    line: int
    source: str = field(default="", compare=False)  # the shapes file

    def to_key(self, gpu_model: str, world_size: int) -> ProblemKey:
        """The problem key of this row on ``gpu_model`` with ``world_size`` ranks."""
        return ProblemKey.make(self.op, gpu_model, world_size, self.dtype, self.shape, self.layout)

    @property
    def identity(self) -> tuple:
        """What makes two rows the same problem (the line number does not)."""
        return (self.op, self.dtype, tuple(self.shape.items()), tuple(self.layout.items()))


def load_shapes(path: str | os.PathLike[str], world_size: int | None = None) -> list[ShapeRow]:
    """Parse a shapes file; with ``world_size``, also check each op's divisibility rules.

    Raises :class:`ShapesError` on the first problem; warns :class:`DuplicateShapeWarning` per repeat.
    """
    name = os.fspath(path)
    if world_size is not None and (isinstance(world_size, bool) or world_size < 1):
        raise ValueError(f"world_size: must be a positive integer, got {world_size!r}")
    lines = _read_lines(name)
    parser = _Parser(name)
    rows: list[ShapeRow] = []
    seen: dict[tuple, int] = {}
    header: list[str] | None = None
    for lineno, text in lines:
        if header is None:
            header = parser.header(lineno, text)
            continue
        row = parser.row(lineno, text, header)
        if world_size is not None:
            parser.check_divisible(row, world_size)
        first = seen.get(row.identity)
        if first is not None:
            warnings.warn(
                f"{name}:{lineno}: duplicate of line {first}; ignored", DuplicateShapeWarning, stacklevel=2
            )
            continue
        seen[row.identity] = lineno
        rows.append(row)
    if header is None:
        raise ShapesError(name, None, None, "empty file (no header line)")
    if not rows:
        raise ShapesError(name, None, None, "no shapes (only a header)")
    return rows


def _read_lines(name: str) -> list[tuple[int, str]]:
    """Non-blank, non-comment lines with their 1-based numbers."""
    try:
        data = Path(name).read_bytes()
    except OSError as e:
        raise ShapesError(name, None, None, f"cannot read: {e.strerror or e}") from None
    if b"\x00" in data:
        raise ShapesError(name, None, None, "not a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ShapesError(name, None, None, "not a text file (not UTF-8)") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            out.append((lineno, line))
    return out


class _Parser:
    def __init__(self, name: str) -> None:
        from .ops import get_op, op_names

        self.name = name
        self.ops = {n: get_op(n) for n in op_names()}
        known = {"op", "dtype"}
        for op in self.ops.values():
            known.update(op.shape_fields)
            known.update(op.layout_choices)
        self.known = known

    def fail(self, line: int | None, field: str | None, problem: str) -> ShapesError:
        return ShapesError(self.name, line, field, problem)

    def header(self, lineno: int, text: str) -> list[str]:
        cols = [c.strip() for c in _split(text)]
        for c in cols:
            if not c:
                raise self.fail(lineno, None, "empty column name in header")
            if c not in self.known:
                if _INT_RE.match(c):
                    raise self.fail(
                        lineno, None, f"missing header line (first line is data: {text.strip()!r})"
                    )
                raise self.fail(lineno, c, f"unknown column (known: {', '.join(sorted(self.known))})")
        dup = next((c for c in cols if cols.count(c) > 1), None)
        if dup is not None:
            raise self.fail(lineno, dup, "column appears twice in header")
        return cols

    def row(self, lineno: int, text: str, header: list[str]) -> ShapeRow:
        values = [v.strip() for v in _split(text)]
        if len(values) != len(header):
            raise self.fail(
                lineno, None, f"expected {len(header)} fields ({','.join(header)}), got {len(values)}"
            )
        cells = dict(zip(header, values, strict=True))
        op_name = cells.get("op") or DEFAULT_OP
        op = self.ops.get(op_name)
        if op is None:
            raise self.fail(lineno, "op", f"unknown op {op_name!r} (known: {', '.join(sorted(self.ops))})")
        dtype = cells.get("dtype") or DEFAULT_DTYPE
        if dtype not in DTYPES:
            raise self.fail(lineno, "dtype", f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
        own = {"op", "dtype", *op.shape_fields, *op.layout_choices}
        for c in header:
            if c not in own and cells[c]:
                raise self.fail(lineno, c, f"not a field of op {op_name!r}")
        shape = {}
        for f in op.shape_fields:
            if f not in cells:
                raise self.fail(
                    lineno, f, f"missing column (op {op_name!r} needs {','.join(op.shape_fields)})"
                )
            value = self.integer(lineno, f, cells[f])
            if value <= 0:
                raise self.fail(lineno, f, f"must be positive, got {value}")
            shape[f] = value
        layout = {}
        for f, choices in op.layout_choices.items():
            text_value = cells.get(f, "")
            if text_value == "":
                value = choices[0]
            elif isinstance(choices[0], str):
                value = text_value
            else:
                value = self.integer(lineno, f, text_value)
            if value not in choices:
                allowed = ", ".join(str(c) for c in choices)
                raise self.fail(lineno, f, f"must be one of {allowed}, got {value}")
            if IMPLICIT_LAYOUT.get(f) != value:  # as in ProblemKey: an implied default is left out
                layout[f] = value
        return ShapeRow(op=op_name, dtype=dtype, shape=shape, layout=layout, line=lineno, source=self.name)

    def integer(self, lineno: int, field: str, text: str) -> int:
        if not text:
            raise self.fail(lineno, field, "missing value")
        if not _INT_RE.match(text):
            raise self.fail(lineno, field, f"not an integer: {text!r}")
        value = int(text)
        if value > MAX_DIM:
            raise self.fail(lineno, field, f"{value} is larger than {MAX_DIM} (no kernel indexes that far)")
        return value

    def check_divisible(self, row: ShapeRow, world_size: int) -> None:
        key = row.to_key("any", world_size)
        try:
            self.ops[row.op].validate(key)
        except ValueError as e:
            message = str(e)
            field, sep, rest = message.partition(":")
            if sep and field.strip() in (*row.shape, *row.layout, "world_size"):
                raise self.fail(row.line, field.strip(), rest.strip()) from None
            raise self.fail(row.line, None, message) from None


def _split(text: str) -> list[str]:
    return next(csv.reader([text]))


def write_shapes(
    keys: Iterable[ProblemKey], path: str | os.PathLike[str], op: str | None = None, what: str = "--out"
) -> int:
    """Write the distinct shapes among ``keys`` (only ``op``'s where given) as a shapes.csv for
    ``autotaxer tune``, in their order (atomically: a temp file, then a rename); returns the row count.
    ``what`` names the option the path came from in a refusal (a device, FIFO or folder).

    Columns: ``op,dtype``, then every written op's shape and layout fields (a row leaves the other ops'
    fields empty); the world size and GPU are the tuner's options.
    """
    from .ops import DEFAULT_OP, get_op

    columns: list[str] = ["op", "dtype"]
    rows: list[dict] = []
    seen: set[tuple] = set()
    for key in keys:
        if op is not None and key.op != op:
            continue
        opobj = get_op(key.op)
        row = {"op": key.op, "dtype": key.dtype, **{f: key[f] for f in opobj.shape_fields}}
        row |= {n: key.get(n, opobj.layout_defaults()[n]) for n in opobj.layout_choices}
        columns += [c for c in row if c not in columns]
        if tuple(row.items()) not in seen:
            seen.add(tuple(row.items()))
            rows.append(row)
    if len(columns) == 2:  # nothing to write: the header of op (default: the registry's default op)
        opobj = get_op(op or DEFAULT_OP)
        columns += [*opobj.shape_fields, *opobj.layout_choices]
    from .output_file import write_atomic

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    w.writerows([row.get(c, "") for c in columns] for row in rows)
    write_atomic(path, buf.getvalue(), what=what)  # a device, FIFO or folder is refused
    return len(rows)
