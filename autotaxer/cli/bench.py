"""``autotaxer bench``: side-by-side benchmark of every ag_gemm and gemm_rs implementation on a shapes file.

Spawns ``--world-size`` ranks (``--device cuda``: one GPU each; ``cpu``: gloo) and runs
:func:`autotaxer.benchmark.run_bench`: BSP, all-gather alone, GEMM alone, every available variant at its
tuned configuration (a capped sweep where it has none), ``dispatch()`` and the peers. One database serves
both the variants' tuned configurations and dispatch's records (above the shipped tables): ``--db``, else
the default one that ``tune`` writes. Prints its estimate first and each row as it finishes; writes JSON
(every number with device, versions and date) and prints a table.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import DbOption, FormatOption, OutputFormat, print_json

DEVICES = ("auto", "cuda", "cpu")


def bench_command(
    world_size: Annotated[int, typer.Option("--world-size", min=1, help="Ranks (GPUs) per problem.")],
    shapes: Annotated[Path, typer.Option("--shapes", help="shapes.csv with the problems to benchmark.")],
    out: Annotated[Path, typer.Option("--out", help="JSON results file.")] = Path("bench_results.json"),
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.")] = "auto",
    db: DbOption = None,
    variants: Annotated[
        str | None, typer.Option("--variants", help="Comma-separated variants (default: every available).")
    ] = None,
    max_configs: Annotated[
        int, typer.Option("--max-configs", min=1, help="Configs swept per variant without a tuned one.")
    ] = 8,
    peers: Annotated[
        bool, typer.Option("--peers/--no-peers", help="PyTorch and Iris stock kernels.", metavar="")
    ] = True,
    dispatch: Annotated[
        bool, typer.Option("--dispatch/--no-dispatch", help="Time dispatch().", metavar="")
    ] = True,
    peer_timeout: Annotated[
        float, typer.Option("--peer-timeout", help="Seconds for Iris stock, per shape.")
    ] = 180.0,
    heap_gib: Annotated[int, typer.Option("--heap-gib", min=1, help="Iris heap per rank (GiB).")] = 8,
    iters: Annotated[
        int | None, typer.Option("--iters", min=1, help="Calls per timed sample (default: the device's).")
    ] = None,
    samples: Annotated[
        int | None, typer.Option("--samples", min=1, help="Timed samples, median of them (GPU default 9).")
    ] = None,
    dispatch_timing: Annotated[
        str | None,
        typer.Option("--dispatch-timing", help="Serve winners tuned with this timing: eager, graph."),
    ] = None,
    fmt: FormatOption = OutputFormat.human,
) -> None:
    """Benchmark every shape in SHAPES side by side; write JSON to --out and print a table."""
    from .._target import detect_target
    from ..benchmark import BenchConfig, cases_from_shapes, run_bench, tuned_params
    from ..measure import TimingConfig
    from ..storage import MissingDatabase, default_url, open_database
    from ..testing import RanksFailed

    if device not in DEVICES:
        raise ValueError(f"--device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if dispatch_timing not in (None, "eager", "graph"):
        raise ValueError(f"--dispatch-timing: expected eager or graph, got {dispatch_timing!r}")
    try:
        target = detect_target(device, world_size)
    except RuntimeError as e:  # --device cuda without enough GPUs: bad input, not a crash
        raise ValueError(str(e)) from None
    cases = cases_from_shapes(_load_rows(shapes, world_size))
    if not cases:
        raise ValueError(f"{shapes}: no ag_gemm or gemm_rs shapes to benchmark")
    timing = TimingConfig.for_device(target.device_type)
    db = db or default_url()  # one source for the tuned configurations and for dispatch's table
    cfg = BenchConfig(
        cases=cases,
        world_size=world_size,
        device=target.device_type,
        variants=tuple(v.strip() for v in variants.split(",") if v.strip()) if variants else None,
        max_configs=max_configs,
        warmup=timing.warmup,
        iters=iters if iters is not None else timing.iters,
        samples=samples if samples is not None else (timing.samples if target.device_type == "cpu" else 9),
        peers=peers,
        dispatch=dispatch,
        db_url=db,
        dispatch_timing=dispatch_timing,
        heap_gib=heap_gib,
        peer_timeout=peer_timeout,
        progress_path=f"{out}.rows.jsonl",
    )
    cfg.validate()
    _check_variants(cfg.variants, target, {c.op for c in cases})
    try:
        with open_database(db, read_only=True) as database:
            tuned = tuned_params(database, cases, target.gpu_model, world_size)
    except MissingDatabase:  # nothing tuned yet: every variant sweeps its seeds
        tuned = {}
    try:
        report = run_bench(cfg, tuned, out)
    except RanksFailed as e:
        typer.echo(f"error: benchmark ranks failed: {e}", err=True)
        raise typer.Exit(1) from None
    if fmt == OutputFormat.json:
        print_json(report)
    else:
        _print_table(report)
        typer.echo(f"wrote {out}")


def _load_rows(path: Path, world_size: int) -> list[Any]:
    from ..shapes import load_shapes

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_shapes(path, world_size)
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    skipped = sum(r.op not in ("ag_gemm", "gemm_rs") for r in rows)
    if skipped:
        typer.echo(
            f"warning: {path}: {skipped} row(s) of other ops skipped (bench: ag_gemm, gemm_rs)", err=True
        )
    return rows


def _check_variants(selected: tuple[str, ...] | None, target: Any, ops: set[str]) -> None:
    """Every name of ``--variants`` is a variant of one of the benchmarked ``ops``, available here."""
    from ..ops import get_op

    if selected is None:
        return
    known = {n: get_op(o) for o in sorted(ops) for n in get_op(o).variants}
    unknown = [n for n in selected if n not in known]
    if unknown:
        raise ValueError(f"--variants: unknown variant(s) {', '.join(unknown)} (known: {', '.join(known)})")
    cannot = [n for n in selected if known[n].variants[n].unavailable_reason(target) is not None]
    if cannot:
        raise ValueError(f"--variants: not available on {target.gpu_model}: {', '.join(cannot)}")


def _cell(us: float | None, bsp: float | None) -> str:
    if us is None:
        return "fail"
    text = f"{us / 1e3:.3f}"
    return f"{text} x{bsp / us:.2f}" if bsp else text


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from ..benchmark import best_us, bsp_us, ceiling_us, comm_entry, row_entries, untimed_label

    names: list[str] = []
    for row in report["rows"]:
        names += [n for n, e in row_entries(row).items() if n not in names and "skipped" not in e]
    title = (
        f"{report['device']} x{report['world_size']}: ms per call (faster of eager/graph), "
        "xSpeedup over the fastest BSP form"
    )
    table = Table(title=title)
    for col in ("op", "N", "K", "dim", "B", "M", "dtype", "BSP", "comm", "GEMM", "ceiling", *names):
        table.add_column(col, justify="right")
    for row in report["rows"]:
        head = [str(row.get("op", "ag_gemm"))]
        head += [str(row.get(f, "kn")) for f in ("N", "K", "gather_dim", "b_layout", "M", "dtype")]
        if "error" in row:
            table.add_row(*head, row["error"], *[""] * (3 + len(names)))
            continue
        bsp = bsp_us(row)
        entries = row_entries(row)
        cells = [_cell(bsp, None), _cell(best_us(comm_entry(row)), None), _cell(best_us(row["gemm"]), None)]
        cells.append(_cell(ceiling_us(row), bsp))
        for n in names:
            if n not in entries:
                cells.append("")
            elif (t := best_us(entries[n])) is None:
                cells.append(untimed_label(entries[n]))
            else:
                cells.append(_cell(t, bsp))
        table.add_row(*head, *cells)
    console = Console()
    Console(width=max(console.width, 160)).print(table)


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to the root app."""
    app.command("bench")(bench_command)
