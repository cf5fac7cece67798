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

from ..ops import DEFAULT_OP
from ._common import FormatOption, GpuFilter, OutputFormat, WorldSizeFilter


def misses_command(
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="Misses file (default: $AUTOTAXER_MISSES, else misses.jsonl in ~/.local/share/autotaxer).",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the missed shapes as a shapes.csv.")
    ] = None,
    op: Annotated[
        str | None,
        typer.Option(
            "--op", help=f"Only this op's misses go to --out, e.g. {DEFAULT_OP} (default: every op's)."
        ),
    ] = None,
    gpu: GpuFilter = None,
    world_size: WorldSizeFilter = None,
    fmt: FormatOption = OutputFormat.human,
) -> None:
    """List the shapes dispatch served without a tuned record.

    Most called first; --out writes them as a shapes file to tune next.
    """
    from ..runtime.misses import default_misses_path, read_misses, write_shapes_csv

    path = file if file is not None else default_misses_path()
    misses = [
        m
        for m in read_misses(path)
        if (gpu is None or m.key.gpu_model == gpu) and (world_size is None or m.key.world_size == world_size)
    ]
    if fmt == OutputFormat.json:
        typer.echo(json.dumps([m.to_dict() for m in misses], indent=2))
    else:
        _print_tables(misses, path)
    if out is not None:
        kept = [m for m in misses if op is None or m.key.op == op]
        if not kept:
            typer.echo(f"no misses{f' of {op}' if op else ''}; {out} not written", err=True)
            return
        n = write_shapes_csv(kept, out)
        ops = sorted({m.key.op for m in kept})
        typer.echo(f"wrote {n} shape(s) of {', '.join(ops)} to {out}", err=fmt == OutputFormat.json)


def _print_tables(misses: list, path: Path) -> None:
    """One table per (op, GPU model, world size), which its title names, so that every row shows its
    whole shape and layout: rows that differ only in a truncated key would read identical."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from .._problem import ProblemKey

    if not misses:
        typer.echo(f"no misses recorded in {path}")
        return
    typer.echo(f"dispatch misses recorded in {path}")
    groups: dict[tuple[str, str, int], list] = {}
    for m in misses:
        groups.setdefault((m.key.op, m.key.gpu_model, m.key.world_size), []).append(m)
    console = Console()
    for (op, gpu, ws), group in groups.items():
        table = Table(title=f"{op} on {gpu}, world size {ws}", box=box.SIMPLE_HEAD)
        table.add_column("problem", no_wrap=True)
        table.add_column("calls", justify="right", no_wrap=True)
        table.add_column("served by", overflow="fold")
        for m in group:
            served = f"{m.variant}, {m.source}"
            if m.tuned_key is not None:  # the tuned record's fields that differ: "nearest M=8192"
                tuned = ProblemKey.from_text(m.tuned_key)
                differ = [f"{k}={v}" for k, v in tuned.shape + tuned.layout if m.key.get(k) != v]
                served += f" {' '.join(differ)}"
            table.add_row(m.key.short_text, str(m.calls), served)
        console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``misses`` command to the root app."""
    app.command("misses")(misses_command)
