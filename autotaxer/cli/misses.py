"""``autotaxer misses``: shapes that dispatch served without an exact tuned record.

Reads the misses file that runtimes append to at shutdown (``$AUTOTAXER_MISSES`` or the default path),
prints the distinct misses with call counts, and with ``--out`` writes them as a shapes.csv for
``autotaxer tune``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def misses_command(
    file: Annotated[
        Path | None, typer.Option("--file", help="Misses file (default: $AUTOTAXER_MISSES).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the missed shapes as a shapes.csv.")
    ] = None,
    op: Annotated[str, typer.Option("--op", help="Op whose shapes go to --out.")] = "ag_gemm",
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only this GPU model.")] = None,
    world_size: Annotated[int | None, typer.Option("--world-size", help="Only this world size.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="human or json.")] = "human",
) -> None:
    """List dispatch misses (most called first); ``--out shapes.csv`` to tune them next."""
    from ..runtime.misses import default_misses_path, read_misses, write_shapes_csv

    if fmt not in ("human", "json"):
        raise typer.BadParameter(f"expected human or json, got {fmt!r}", param_hint="--format")
    path = file if file is not None else default_misses_path()
    misses = [
        m
        for m in read_misses(path)
        if (gpu is None or m.key.gpu_model == gpu) and (world_size is None or m.key.world_size == world_size)
    ]
    if fmt == "json":
        typer.echo(json.dumps([m.to_dict() for m in misses], indent=2))
    else:
        _print_table(misses, path)
    if out is not None:
        if not any(m.key.op == op for m in misses):
            typer.echo(f"no misses of {op}; {out} not written", err=True)
            return
        n = write_shapes_csv(misses, out, op=op)
        typer.echo(f"wrote {n} shape(s) to {out}", err=fmt == "json")


def _print_table(misses: list, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    if not misses:
        typer.echo(f"no misses recorded in {path}")
        return
    table = Table(title=f"dispatch misses ({path})")
    for col in ("key", "calls", "served by", "source"):
        table.add_column(col)
    for m in misses:
        served = m.variant if m.tuned_key is None else f"{m.variant} (from {m.tuned_key})"
        table.add_row(m.key.text, str(m.calls), served, m.source)
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add the ``misses`` command to the root app."""
    app.command("misses")(misses_command)
