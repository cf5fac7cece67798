"""Shared option aliases and helpers of the ``autotaxer`` commands."""

from __future__ import annotations

import json
import warnings
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..ops import DEFAULT_OP

if TYPE_CHECKING:
    from autotaxer.records import WinnerRecord
    from autotaxer.storage import Database


class OutputFormat(str, Enum):
    human = "human"
    json = "json"


def flag(*decls: str, help: str) -> Any:
    """A boolean option (``"--x"``, ``"--x/--no-x"``, short names after) shown in ``--help`` as a bare
    flag, without a ``<bool>`` placeholder."""
    return typer.Option(*decls, help=help, metavar="")


def choice(decl: str, choices: tuple[str, ...], *, help: str) -> Any:
    """An option taking one of ``choices``, shown in ``--help`` as ``<a|b|c>``; any other value is a usage
    error naming the option and the choices (exit 2)."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    return typer.Option(decl, help=help, metavar=f"<{'|'.join(choices)}>", callback=check)


def count(*decls: str, help: str) -> Any:
    """An integer option that must be at least 1, shown in ``--help`` as ``<int>`` like every other
    integer (typer's ``min=1`` shows ``<int range> [x>=1]``); 0 or less is a usage error naming the option
    (exit 2)."""

    def check(value: int | None) -> int | None:
        if value is not None and value < 1:
            raise typer.BadParameter(f"must be at least 1, got {value}")
        return value

    return typer.Option(*decls, help=help, metavar="<int>", callback=check)


#: Timing modes of ``--timing`` and ``--dispatch-timing`` (eager back-to-back calls, CUDA-graph replays).
TIMINGS = ("eager", "graph")

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="AUTOTAXER_DB",
        show_default=False,
        help="SQLAlchemy URL of the tuning database (default: a SQLite file in ~/.local/share/autotaxer).",
    ),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", help="Output for people or for programs.")]
QuietOption = Annotated[bool, flag("--quiet", "-q", help="Print only errors.")]
OpFilter = Annotated[str | None, typer.Option("--op", help=f"Only this op, e.g. {DEFAULT_OP}.")]
GpuFilter = Annotated[
    str | None,
    typer.Option("--gpu", help="Only this normalized GPU model, e.g. nvidia-h200."),
]
#: Options of the commands that run problems on spawned ranks (``tune``, ``bench``).
DEVICES = ("auto", "cuda", "cpu")
WorldSizeOption = Annotated[int, typer.Option("--world-size", help="Ranks (GPUs) per problem.")]
ShapesOption = Annotated[Path, typer.Option("--shapes", help="shapes.csv with the problems, one a row.")]
DeviceOption = Annotated[str, choice("--device", DEVICES, help="auto: GPUs when visible, else CPU.")]


def _check_variants(value: str | None) -> str | None:
    """``--variants``' callback: a usage error (exit 2) for an empty list, an empty name or a repeat."""
    try:
        variant_names(value)
    except ValueError as e:
        raise typer.BadParameter(str(e).removeprefix("--variants: ")) from None
    return value


VariantsOption = Annotated[
    str | None,
    typer.Option(
        "--variants",
        help="Comma-separated variants (default: every one; the BSP forms always).",
        callback=_check_variants,
    ),
]
YesOption = Annotated[bool, flag("--yes", help="Run even a CPU run estimated at more than an hour.")]
WorldSizeFilter = Annotated[
    int | None,
    count("--world-size", help="Only this world size."),
]


def variant_names(text: str | None) -> tuple[str, ...] | None:
    """The names of a ``--variants`` list (None: the option was not given, so every variant);
    ``ValueError`` naming the option for an empty list, an empty name or a name given twice."""
    if text is None:
        return None
    names = tuple(v.strip() for v in text.split(","))
    if not any(names):
        raise ValueError(f"--variants: names no variant (got {text!r}): leave it out for every variant")
    if not all(names):
        raise ValueError(f"--variants: an empty name in {text!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--variants: {', '.join(twice)} named more than once in {text!r}")
    return names


def load_rows(path: Path, world_size: int) -> list[Any]:
    """The rows of the shapes file ``path``, its warnings echoed as ``warning: ...`` lines on stderr."""
    from autotaxer.shapes import load_shapes

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_shapes(path, world_size)
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    return rows


def open_db(url: str | None, upgrade: bool = True, read_only: bool = False) -> Database:
    """Open the tuning database (migrating it unless ``upgrade`` is False; ``read_only``: a read command,
    which writes, creates and migrates nothing)."""
    from autotaxer.storage import open_database

    return open_database(url, upgrade=upgrade, read_only=read_only)


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    typer.echo(json.dumps(obj, indent=1, default=str))


def params_text(rec: WinnerRecord) -> str:
    """Parameters in one short line: ``BLOCK_M=128 num_warps=8``."""
    return " ".join(f"{k}={v}" for k, v in rec.params.items()) or "-"
