"""``autotaxer report``: bench results and the tuning database as a self-contained HTML page and PNGs."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from ._common import DbOption, flag


def report_command(
    results: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Bench results JSON files or folders (folders: every bench *.json in them).",
            metavar="RESULTS",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for index.html and the PNGs.")] = Path("report"),
    db: DbOption = None,
    no_db: Annotated[bool, flag("--no-db", help="Bench results only; do not read a database.")] = False,
) -> None:
    """Write an HTML report of bench results and the tuning database.

    OUT/index.html embeds the plots, also written as OUT/*.png (needs the report extra: matplotlib).
    """
    from ..report import write_report
    from ..storage import default_url

    url = None if no_db else (db or default_url())
    result = write_report(out, results or (), url)
    width = shutil.get_terminal_size((80, 24)).columns
    for note in result.notes:
        typer.echo(
            textwrap.fill(f"note: {note}", width, subsequent_indent="  ", break_long_words=False), err=True
        )
    typer.echo(f"wrote {result.html_path} and {len(result.png_paths)} plot(s)")


class _ReportCommand(TyperCommand):
    """``report`` with its RESULTS argument shown as ``<path>...`` in the help (typer: ``<list[Path]>``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:
            if param.name == "results":
                param.display_type_rich = lambda ctx: "<path>..."
        return params


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the root app."""
    app.command("report", cls=_ReportCommand)(report_command)
