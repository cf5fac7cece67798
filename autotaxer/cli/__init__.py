"""The ``autotaxer`` command: a small root app assembling one module per command group.

Known errors (bad input files, database problems: ``ValueError`` subclasses such as ``ShapesError``
and ``TableFileError``, and ``DatabaseError``) print ``error: <message>`` on stderr and exit 2; file
system errors exit 1.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from autotaxer.storage import DatabaseError

from . import db, doctor, merge, show, table

#: Exit status for bad input (files, options, databases) reported as ``error: ...``.
EXIT_BAD_INPUT = 2
#: Exit status for other failures.
EXIT_FAILURE = 1


class _Command(TyperCommand):
    """A command whose usage line names a required argument plainly (``FILE``, as its help does), not in
    typer's braces (``{FILE}``)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [re.sub(r"^\{(.*)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]


def _plain_usage(group: Any) -> None:
    """Make every typer command under ``group`` a :class:`_Command` (it adds no state to typer's)."""
    for command in group.commands.values():
        if type(command) is TyperCommand:
            command.__class__ = _Command
        elif isinstance(command, TyperGroup):
            _plain_usage(command)


class _ErrorHandlingGroup(TyperGroup):
    """The root group: every command runs inside :meth:`invoke`, so its errors are handled here; usage
    lines name arguments plainly (:class:`_Command`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_usage(self)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (DatabaseError, ValueError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except OSError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(EXIT_FAILURE) from None


app = typer.Typer(
    name="autotaxer",
    cls=_ErrorHandlingGroup,
    help="Autotune fused multi-GPU kernels (all-gather + GEMM, GEMM + reduce-scatter, flash decoding; "
    "Triton kernels on Iris or the copy engine, BSP forms and PyTorch's fused ops as candidates) per GPU, "
    "world size and shape; store the winners and serve them through autotaxer.dispatch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: paragraphs reflowed to the terminal, no truncated option names
)

db.register(app)
show.register(app)
table.register(app)
merge.register(app)
doctor.register(app)

# Commands owned by other modules, registered when they are present.
for _name in ("tune", "misses", "bench", "report"):
    _qual = f"{__name__}.{_name}"
    try:
        _module = importlib.import_module(_qual)
    except ModuleNotFoundError as _e:
        if _e.name != _qual:
            raise
        continue
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
