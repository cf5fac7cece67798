"""``autotaxer merge``: fold re-tuned records into a table file (after a kernel change), no database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import QuietOption, flag


def _name(key: Any) -> str:
    shape = ",".join(f"{k}={v}" for k, v in key.shape)
    layout = ",".join(f"{k}={v}" for k, v in key.layout)
    return f"{key.op} ws{key.world_size} {key.dtype} {shape} {layout}".rstrip()


def pick(table: list, new: list, margin: float | None) -> tuple[list, list[str]]:
    """The records of ``new`` that replace or join ``table``'s, and one line per record of ``new``.

    A record is taken when its key is not in ``table``, when the table's record is stale (tuned with other
    kernel sources), or when its speedup over BSP (measured in its own run, so comparable across runs)
    beats the table's by more than ``margin``; ``margin=None`` takes every record.
    """
    from autotaxer.runtime.table import stale_reasons

    old = {r.key: r for r in table}
    picked, lines = [], []
    for rec in new:
        before = old.get(rec.key)
        if before is None:
            why = "new key"
        elif margin is None:
            why = "replace"
        elif stale_reasons(before, {}):
            why = "the table's record is stale"
        elif rec.speedup > before.speedup * (1 + margin):
            why = f"faster: {rec.speedup:.3f}x vs {before.speedup:.3f}x over BSP"
        else:
            lines.append(
                f"keep  {_name(rec.key)}: the table's {before.variant} {before.speedup:.3f}x, "
                f"new {rec.variant} {rec.speedup:.3f}x"
            )
            continue
        picked.append(rec)
        was = f"{before.variant} {before.speedup:.3f}x" if before is not None else "-"
        lines.append(f"take  {_name(rec.key)}: {why}; was {was}, now {rec.variant} {rec.speedup:.3f}x")
    return picked, lines


def merge(
    table: Annotated[Path, typer.Argument(help="The table to update (.json or .csv).", metavar="TABLE")],
    new: Annotated[
        Path, typer.Argument(help="Freshly tuned records (autotaxer export of the re-tune).", metavar="NEW")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Where to write (default: TABLE, replaced atomically)."),
    ] = None,
    margin: Annotated[
        float,
        typer.Option(
            help="Speedup gain over BSP a current record of TABLE must be beaten by to be replaced."
        ),
    ] = 0.02,
    replace_all: Annotated[bool, flag("--all", help="Take every new record, whatever TABLE holds.")] = False,
    quiet: QuietOption = False,
) -> None:
    """Merge re-tuned records into a table file.

    New keys and the table's stale records are taken, current ones only when beaten by more than --margin
    (--all: every new record); other records stay as they are.
    """
    from autotaxer.records import timing_of
    from autotaxer.table_file import read_table, write_table

    if margin < 0:
        raise ValueError(f"--margin: must be >= 0, got {margin}")
    base, fresh = read_table(table), read_table(new)  # a bad file fails here, before anything is written
    modes = {timing_of(r.env) for r in base} | {timing_of(r.env) for r in fresh}
    if len(modes) > 1:
        raise ValueError(
            f"{table}, {new}: records of timing modes {', '.join(sorted(modes))}; a table holds one "
            "timing mode (merge the eager and graph tables separately). Nothing was written"
        )
    picked, lines = pick(base, fresh, None if replace_all else margin)
    taken = {r.key: r for r in picked}
    merged = [taken.pop(r.key, r) for r in base] + list(taken.values())
    target = out or table
    write_table(merged, target)
    if not quiet:
        typer.echo("\n".join(lines))
        typer.echo(f"{len(picked)} of {len(fresh)} new record(s) taken; {len(merged)} record(s) -> {target}")


def register(app: typer.Typer) -> None:
    """Add ``merge`` to ``app``."""
    app.command("merge")(merge)
