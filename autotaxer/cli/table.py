"""``autotaxer export`` / ``autotaxer import``: tuning tables as JSON or CSV files."""

from __future__ import annotations

from collections import Counter
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import (
    TIMINGS,
    DbOption,
    GpuFilter,
    OpFilter,
    QuietOption,
    WorldSizeFilter,
    choice,
    flag,
    open_db,
)


class FileFormat(str, Enum):
    json = "json"
    csv = "csv"


def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write (.json or .csv).")],
    db: DbOption = None,
    op: OpFilter = None,
    gpu: GpuFilter = None,
    world_size: WorldSizeFilter = None,
    file_format: Annotated[
        FileFormat | None,
        typer.Option("--file-format", help="json or csv (default: from the suffix of --out)."),
    ] = None,
    timing: Annotated[
        str | None,
        choice(
            "--timing",
            TIMINGS,
            help="Only records timed this way (a warm-up's database holds both: eager for training and "
            "forward steps, graph for CUDA-graph ones; each belongs in the table of its timing).",
        ),
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Write the stored winners to a table file.

    Dispatch reads the file (RuntimeConfig(tables=...) or $AUTOTAXER_TABLE) and so does autotaxer import.
    """
    from autotaxer.records import timing_of
    from autotaxer.table_file import table_format, write_table

    fmt = table_format(out, file_format.value if file_format else None)  # bad suffix: fail before opening
    with open_db(db, read_only=True) as database:
        recs = database.winners(op=op, gpu_model=gpu, world_size=world_size)
        url = database.display_url
    if timing is not None:
        recs = [r for r in recs if timing_of(r.env) == timing]
    n = write_table(recs, out, fmt)
    if not quiet:
        typer.echo(f"exported {n} record(s) from {url} to {out} ({fmt})")


def _check_problems(recs: list[Any], file: Path) -> None:
    """``TableFileError`` naming the record when its key is not a problem of a registered op: an unknown
    op, shape fields other than the op's (``{"X": 1}`` where ag_gemm has M, N, K), an unknown layout field
    or value, or a shape the op refuses. Such records would be stored, then break every command reading
    them."""
    from autotaxer.ops import get_op, op_names
    from autotaxer.table_file import TableFileError

    for i, rec in enumerate(recs):
        key = rec.key
        where = f"{file}: record {i + 1} ({key.text})"
        if key.op not in op_names():
            raise TableFileError(f"{where}: op {key.op!r} is not registered (known: {', '.join(op_names())})")
        op = get_op(key.op)
        fields = tuple(name for name, _ in key.shape)
        if fields != tuple(op.shape_fields):
            raise TableFileError(
                f"{where}: shape fields {', '.join(fields) or 'none'}, expected {', '.join(op.shape_fields)}"
            )
        for name, value in key.layout:
            if name not in op.layout_choices or value not in op.layout_choices[name]:
                raise TableFileError(f"{where}: layout {name}={value!r} is not one of {op.name}'s layouts")
        try:
            op.validate(key)
        except ValueError as e:
            raise TableFileError(f"{where}: {e}") from None


def import_table(
    file: Annotated[
        Path, typer.Argument(help="A table written by autotaxer export (.json or .csv).", metavar="FILE")
    ],
    db: DbOption = None,
    replace: Annotated[
        bool, flag("--replace", help="Overwrite stored records even when they are faster.")
    ] = False,
    quiet: QuietOption = False,
) -> None:
    """Merge a table file into the database.

    One transaction; of two records of a key the faster one is kept unless --replace.
    """
    from autotaxer.table_file import read_table

    recs = read_table(file)  # a bad file fails here, before the database is opened
    _check_problems(recs, file)
    with open_db(db) as database:
        other = _other_timing(recs, database.winners())
        if other and not replace:  # one timing mode per key: the other mode's records are never dropped
            counts = "; ".join(
                f"{n} stored {was}-timed, {now}-timed in the file" for (was, now), n in other.items()
            )
            typer.echo(
                f"error: {file}: {sum(other.values())} record(s) are timed differently from the stored "
                f"record of the same key in {database.display_url} ({counts}); a database holds one timing "
                "mode per key: import into another --db, or pass --replace to overwrite them. Nothing was "
                "written",
                err=True,
            )
            raise typer.Exit(2)
        written, kept = database.upsert_winners(recs, replace=replace)
        url = database.display_url
    if not quiet:
        replaced = (
            f"; {sum(other.values())} of them replaced records of the other timing mode" if other else ""
        )
        typer.echo(
            f"imported {file} into {url}: {written} written, {kept} kept (stored record as fast or faster)"
            + replaced
        )


def _other_timing(recs: list, stored: list) -> Counter:
    """``(stored mode, file mode) -> count`` of the records whose key is stored with another timing mode."""
    from autotaxer.records import timing_of

    modes = {r.key: timing_of(r.env) for r in stored}
    return Counter(
        (modes[r.key], timing_of(r.env))
        for r in recs
        if modes.get(r.key, timing_of(r.env)) != timing_of(r.env)
    )


def register(app: typer.Typer) -> None:
    """Add ``export`` and ``import`` to ``app``."""
    app.command("export")(export)
    app.command("import")(import_table)
