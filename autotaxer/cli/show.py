"""``autotaxer show``: the stored winners as a table (speedup over BSP, and in the user's step where a
warm-up checked it, visible) or JSON."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer

from ..ops import DEFAULT_OP
from ..records import in_step_of
from ._common import (
    DbOption,
    FormatOption,
    GpuFilter,
    OpFilter,
    OutputFormat,
    WorldSizeFilter,
    flag,
    open_db,
    params_text,
    print_json,
)


def show(
    db: DbOption = None,
    op: OpFilter = None,
    gpu: GpuFilter = None,
    world_size: WorldSizeFilter = None,
    fmt: FormatOption = OutputFormat.human,
    stale_out: Annotated[
        Path | None,
        typer.Option(
            "--stale-out",
            help=f"Write the stale records' shapes (of --op, default {DEFAULT_OP}) as a shapes.csv to "
            "re-tune.",
        ),
    ] = None,
    wide: Annotated[
        bool, flag("--wide", help="Every field: full keys, parameters, BSP time, trials, dates.")
    ] = False,
) -> None:
    """Print the winner of every tuned problem.

    --wide shows every field, --format json is for programs.
    """
    from autotaxer.storage import MissingDatabase

    try:
        with open_db(db, read_only=True) as database:
            recs = database.winners(op=op, gpu_model=gpu, world_size=world_size)
            url = database.display_url
    except MissingDatabase as e:
        if fmt is OutputFormat.json:
            print_json([])
        else:
            typer.echo(f"no winners: {e}")
        return
    from ..runtime.table import stale_report

    human = fmt is not OutputFormat.json and recs
    report = stale_report(recs) if stale_out is not None or human else []
    if stale_out is not None:
        _write_stale(report, stale_out, op or DEFAULT_OP)
    if fmt is OutputFormat.json:
        print_json([_json_row(r) for r in recs])
        return
    if not recs:
        typer.echo(f"no winners in {url} matching the filters")
        return
    from rich.console import Console
    from rich.table import Table

    stale = {(s.key, s.variant): "; ".join(s.reasons) for s in report}
    if not wide:
        _print_compact(recs, stale, url)
        return
    names = ("op", "gpu", "ws", "dtype", "shape", "layout", "variant", "params", "median µs", "BSP µs",
             "speedup", "in-step", "trials", "measured (UTC)",
             "stale (tuned with other kernels/versions)")  # fmt: skip
    rows = [_wide_cells(r, stale) for r in recs]
    t = Table(title=f"winners in {url}")
    for i, name in enumerate(names):
        t.add_column(name, justify="right" if 8 <= i <= 12 else "left")
    for cells in rows:
        t.add_row(*cells)
    console = Console()
    if console.measure(t, options=console.options.update_width(10_000)).maximum <= console.width:
        console.print(t)
        _unconfirmed_legend(recs, console)
        return
    console.print(f"winners in {url}, one record a block (the table needs a wider terminal)", highlight=False)
    labels = (*names[:-1], "stale")
    width = max(map(len, labels))
    room = max(console.width - width - 4, 20)  # a value wraps under itself
    for cells in rows:
        typer.echo("")
        for name, cell in zip(labels, cells, strict=True):
            first, *rest = textwrap.wrap(cell, room, break_on_hyphens=False) or [""]
            typer.echo(f"  {name.ljust(width)}  {first}")
            for more in rest:
                typer.echo(f"  {'':{width}}  {more}")
    _unconfirmed_legend(recs, console)


def _wide_cells(r: Any, stale: dict) -> list[str]:
    """Every field of the record ``r`` as ``show --wide`` prints it."""
    k = r.key
    return [
        k.op, k.gpu_model, str(k.world_size), k.dtype, k.shape_text, k.layout_text, variant_cell(r),
        params_text(r), f"{r.median_us:.1f}", f"{r.bsp_us:.1f}", speedup_cell(r), in_step_text(r),
        str(r.trials), r.measured_at.strftime("%Y-%m-%d %H:%M"), stale.get((r.key, r.variant), "-"),
    ]  # fmt: skip


def speedup_cell(rec: Any) -> str:
    """A record's speedup over the fastest BSP form, ``-`` where the tuner did not confirm it (a record
    from before winners were re-timed beside BSP: the best of its trials against one BSP sample)."""
    from ..records import is_confirmed

    return f"{rec.speedup:.2f}×" if is_confirmed(rec.env) else "-"


def _unconfirmed_legend(recs: list, console: Any) -> None:
    from ..records import is_confirmed

    if not all(is_confirmed(r.env) for r in recs):
        console.print("- : speedup not confirmed (tuned before confirmation; --retune confirms)")
    if any(timed_eagerly(r) for r in recs):
        console.print("† timed before CUDA-graph replays: understates it (--retune re-times it)")


def timed_eagerly(rec: Any) -> bool:
    """Whether dispatch serves ``rec``'s winner as CUDA-graph replays (:func:`~..runtime.replay.replayable`
    on the record's device) but it was timed eagerly, every launch from Python (no ``env["launch"]``): its
    speedup understates what dispatch serves."""
    from ..ops import get_op
    from ..runtime.replay import replayable

    try:
        op = get_op(rec.key.op)
        variant = op.variants[rec.variant]
    except KeyError:
        return False
    eager = rec.env.get("timing", "eager") == "eager" and rec.env.get("launch") != "replay"
    return eager and replayable(op, variant, rec.device_type)


def variant_cell(rec: Any) -> str:
    """The winner's name, marked ``†`` where :func:`timed_eagerly`."""
    return rec.variant + ("†" if timed_eagerly(rec) else "")


def _print_compact(recs: list, stale: dict, url: str) -> None:
    """One table per (op, GPU, world size): problem, winner, time and speedup over BSP (fits 80
    columns); stale records marked ``*``."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"winners in {url}")
    groups: dict[tuple[str, str, int], list] = {}
    for r in recs:
        groups.setdefault((r.key.op, r.key.gpu_model, r.key.world_size), []).append(r)
    for (op, gpu, ws), group in sorted(groups.items()):
        t = Table(title=f"{op} on {gpu}, world size {ws}", box=box.SIMPLE_HEAD)
        t.add_column("problem", no_wrap=True)
        t.add_column("winner", no_wrap=True)
        t.add_column("µs", justify="right", no_wrap=True)
        t.add_column("×BSP", justify="right", no_wrap=True)
        t.add_column("×step", justify="right", no_wrap=True)
        for r in group:
            mark = "*" if (r.key, r.variant) in stale else ""
            row = (
                r.key.short_text,
                variant_cell(r) + mark,
                f"{r.median_us:,.1f}",
                speedup_cell(r),
                in_step_text(r),
            )
            t.add_row(*row)
        console.print(t)
    _unconfirmed_legend(recs, console)
    if any(in_step_of(r.env)[0] is not None for r in recs):
        console.print(
            "×step: the step's time with the fastest form over its time with the winner (autotaxer.warmup); "
            "a winner named there did not speed the step up: its fastest form is served"
        )
    if stale:
        console.print(f"* {len(stale)} stale: tuned with other kernel sources or versions (--wide says why)")


def in_step_text(rec: Any) -> str:
    """What warm-up's in-step check found for ``rec``: its winner's gain in the user's step (``1.08×``;
    kept with other near misses: ``1.01× (together 1.04×)``), the winner it turned down and that one's
    gain (``push 0.93×``), ``unchecked``, or ``-``."""
    from ..records import IN_STEP_WINNER, in_step_joint_of

    status, gain = in_step_of(rec.env)
    if status is None:
        return "-"
    if gain is None:
        return status
    if status == "replaced":
        return f"{rec.env.get(IN_STEP_WINNER) or '?'} {gain:.2f}×"
    joint = in_step_joint_of(rec.env)
    return f"{gain:.2f}× (together {joint:.2f}×)" if joint is not None else f"{gain:.2f}×"


def _json_row(rec: Any) -> dict[str, Any]:
    """A record's JSON row: its fields, then the in-step check's status and gain (null when none)."""
    status, gain = in_step_of(rec.env)
    return {**rec.to_dict(), "in_step": status, "in_step_gain": gain}


def _write_stale(report: list, path: Path, op: str) -> None:
    """The shapes of the stale records of ``op`` in ``report`` (:func:`stale_report`) as a shapes.csv
    (to stderr: what was written)."""
    from ..shapes import write_shapes

    keys = [s.key for s in report if s.key.op == op]
    n = write_shapes(keys, path, op, what="--stale-out")
    typer.echo(f"wrote {n} stale {op} shape(s) to {path}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``show`` to ``app``."""
    app.command("show")(show)
