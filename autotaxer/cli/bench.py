"""``autotaxer bench``: side-by-side benchmark of every implementation of each op on a shapes file.

Spawns ``--world-size`` ranks (``--device cuda``: one GPU each; ``cpu``: gloo) and runs
:func:`autotaxer.benchmark.run.run_bench`: BSP, all-gather alone, GEMM alone, every available variant at its
tuned configuration (a capped sweep where it has none), ``dispatch()`` and the peers. One database serves
both the variants' tuned configurations and dispatch's records (above the shipped tables): ``--db``, else
the default one that ``tune`` writes. Prints its estimate first and each row as it finishes; writes JSON
(every number with device, versions and date) and prints a table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..benchmark.rows import SPEEDUP
from ..measure import CHAINS
from ._common import (
    TIMINGS,
    DbOption,
    DeviceOption,
    FormatOption,
    OutputFormat,
    ShapesOption,
    VariantsOption,
    WorldSizeOption,
    YesOption,
    choice,
    count,
    flag,
    load_rows,
    print_json,
    variant_names,
)

#: Timed samples of a row's entries on a CPU: with the tuner's 3, the same form timed twice in one row read
#: up to 2.7x apart on 2 shared cores (a few ms a sample, so 15 cost well under a second a row).
CPU_SAMPLES = 15


def bench_command(
    world_size: WorldSizeOption,
    shapes: ShapesOption,
    out: Annotated[
        Path,
        typer.Option("--out", help="JSON results file; each row also goes to OUT.rows.jsonl as it finishes."),
    ] = Path("bench_results.json"),
    device: DeviceOption = "auto",
    db: DbOption = None,
    variants: VariantsOption = None,
    max_configs: Annotated[
        int, count("--max-configs", help="Configs swept per variant without a tuned one.")
    ] = 8,
    peers: Annotated[bool, flag("--peers/--no-peers", help="PyTorch and Iris stock kernels.")] = True,
    dispatch: Annotated[bool, flag("--dispatch/--no-dispatch", help="Time dispatch().")] = True,
    peer_timeout: Annotated[
        float, typer.Option("--peer-timeout", help="Seconds for Iris stock, per shape.")
    ] = 180.0,
    heap_gib: Annotated[int, count("--heap-gib", help="Iris heap per rank (GiB).")] = 8,
    iters: Annotated[
        int | None, count("--iters", help="Calls per timed sample (default: the device's).")
    ] = None,
    samples: Annotated[
        int | None,
        count("--samples", help="Timed samples, median of them (default: 9 on GPUs, 15 on a CPU)."),
    ] = None,
    dispatch_timing: Annotated[
        str | None, choice("--dispatch-timing", TIMINGS, help="Serve only winners tuned with this timing.")
    ] = None,
    chain: Annotated[
        str,
        choice(
            "--chain",
            CHAINS,
            help="dependent: each timed call waits for the previous call's output (as in the tuner); "
            "back-to-back: independent calls.",
        ),
    ] = "dependent",
    fmt: FormatOption = OutputFormat.human,
    yes: YesOption = False,
) -> None:
    """Benchmark every form of each shape side by side.

    BSP, the communication and the GEMM alone (the ceiling), every variant at its tuned configuration,
    dispatch and the peers; tuned configurations and dispatch's records come from one database (--db, else
    the default one). Writes JSON to --out and prints a table.
    """
    from .._launch import RanksFailed
    from .._target import detect_target
    from ..benchmark.case import BenchConfig, cases_from_shapes
    from ..benchmark.run import run_bench
    from ..benchmark.tuned import tuned_params
    from ..measure import TimingConfig
    from ..output_file import output_path
    from ..storage import MissingDatabase, default_url, open_database

    if world_size < 1:
        raise ValueError(f"--world-size: must be >= 1, got {world_size}")
    output_path(out, "--out", make_folder=True)  # before the run, not after it: a folder, a device, ...
    output_path(f"{out}.rows.jsonl", "--out (its progress log, OUT.rows.jsonl)")
    try:
        target = detect_target(device, world_size)
    except RuntimeError as e:  # --device cuda without enough GPUs: bad input, not a crash
        raise ValueError(str(e)) from None
    cases = cases_from_shapes(_load_rows(shapes, world_size))
    if not cases:
        raise ValueError(f"{shapes}: no shapes to benchmark (bench runs {', '.join(_bench_ops())})")
    timing = TimingConfig.for_device(target.device_type)
    db = db or default_url()  # one source for the tuned configurations and for dispatch's table
    cfg = BenchConfig(
        cases=cases,
        world_size=world_size,
        device=target.device_type,
        variants=variant_names(variants),
        max_configs=max_configs,
        warmup=timing.warmup,
        iters=iters if iters is not None else timing.iters,
        samples=samples if samples is not None else (CPU_SAMPLES if target.device_type == "cpu" else 9),
        peers=peers,
        dispatch=dispatch,
        db_url=db,
        dispatch_timing=dispatch_timing,
        heap_gib=heap_gib,
        peer_timeout=peer_timeout,
        progress_path=f"{out}.rows.jsonl",
        chain=chain,
    )
    cfg.validate()
    _check_variants(cfg.variants, target, {c.op for c in cases})
    _announce(cfg, target, yes)
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
        typer.echo(f"wrote {out} (and each row as it finished: {cfg.progress_path})")


def _load_rows(path: Path, world_size: int) -> list[Any]:
    rows = load_rows(path, world_size)
    ops = _bench_ops()
    skipped = sum(r.op not in ops for r in rows)
    if skipped:
        typer.echo(
            f"warning: {path}: {skipped} row(s) of other ops skipped (bench: {', '.join(ops)})", err=True
        )
    return rows


def _bench_ops() -> list[str]:
    """The ops ``bench`` runs (those with a ``bench`` integration)."""
    from ..benchmark.form import bench_ops

    return [op.name for op in bench_ops()]


def _announce(cfg: Any, target: Any, yes: bool) -> None:
    """Say how long the run takes before it starts: on CPU an estimate (refused above an hour without
    ``--yes``), on GPUs the number of rows; each row is printed as it finishes."""
    from ..benchmark.rank import row_variants
    from ._estimate import bench_calls, bench_cpu_seconds, verdict

    rows = f"{len(cfg.cases)} row(s)"
    if target.device_type != "cpu":
        typer.echo(f"bench: {rows} on {cfg.world_size} GPU(s); each row is printed as it finishes", err=True)
        return
    variants = max(len(row_variants(c.op, target, cfg.variants, cfg.world_size)) for c in cfg.cases)
    calls = bench_calls(variants, cfg.max_configs, cfg.warmup, cfg.iters, cfg.samples)
    seconds = bench_cpu_seconds(list(cfg.cases), cfg.world_size, calls)
    found = verdict(seconds, f"these {rows}", yes)
    if found is not None and found[0] == "refuse":
        raise ValueError(found[1])
    typer.echo(found[1] if found else f"bench: {rows} on the CPU pipeline, about {max(1, round(seconds))} s "
               "of GEMMs; each row is printed as it finishes", err=True)  # fmt: skip


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
    return f"{text} {SPEEDUP}{bsp / us:.2f}" if bsp else text


def _print_table(report: dict[str, Any]) -> None:
    """Every entry side by side where the terminal is wide enough, else the compact table."""
    from rich.console import Console

    console = Console()
    table = _full_table(report)
    if console.measure(table, options=console.options.update_width(10_000)).maximum > console.width:
        table = _compact_table(report)
    console.print(table)


def _head(row: dict[str, Any], dtype: bool, op: bool) -> str:
    """A row's problem in one short cell: ``64x256x256 gd=1 nk`` (the op and the dtype when asked)."""
    from ..benchmark.rows import problem_text

    text = problem_text(row, compact=True, op=op)
    return f"{text} {row['dtype']}" if dtype else text


def _full_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    from ..benchmark.rows import (
        best_us,
        bsp_us,
        case_fields,
        ceiling_us,
        comm_entry,
        compute_entry,
        row_entries,
        row_op,
        untimed_label,
    )

    names: list[str] = []
    for row in report["rows"]:
        names += [n for n, e in row_entries(row).items() if n not in names and "skipped" not in e]
    title = (
        f"{report['device']} ×{report['world_size']}: ms per call (faster of eager/graph), "
        "×speedup over the fastest BSP form; each row timed interleaved in one run"
    )
    table = Table(title=title)
    fields: list[str] = []
    for row in report["rows"]:
        fields += [f for f in case_fields(row) if f not in fields]
    for col in ("op", *fields, "dtype", "BSP", "comm", "compute", "ceiling", *names):
        table.add_column(col, justify="right")
    for row in report["rows"]:
        own = case_fields(row)
        head = [row_op(row), *(str(own.get(f, "")) for f in fields), str(row.get("dtype", ""))]
        if "error" in row:
            table.add_row(*head, row["error"], *[""] * (3 + len(names)))
            continue
        bsp = bsp_us(row)
        entries = row_entries(row)
        cells = [
            _cell(bsp, None),
            _cell(best_us(comm_entry(row)), None),
            _cell(best_us(compute_entry(row)), None),
        ]
        cells.append(_cell(ceiling_us(row), bsp))
        for n in names:
            if n not in entries:
                cells.append("")
            elif (t := best_us(entries[n])) is None:
                cells.append(untimed_label(entries[n]))
            else:
                cells.append(_cell(t, bsp))
        table.add_row(*head, *cells)
    return table


def _compact_table(report: dict[str, Any]) -> Any:
    """One line per row for narrow terminals: BSP, the fastest variant or peer and its speedup, dispatch's
    speedup and the ceiling's (every entry: a wider terminal, or the JSON file)."""
    from rich import box
    from rich.table import Table

    from ..benchmark.rows import best_us, bsp_us, ceiling_us, fastest_entry, row_op, served_text

    dtypes = {row.get("dtype") for row in report["rows"]}
    ops = {row_op(row) for row in report["rows"]}
    title = f"{report['device']} ×{report['world_size']}"
    title += f", {next(iter(ops))}" if len(ops) == 1 else ""
    title += f", {next(iter(dtypes))}" if len(dtypes) == 1 else ""
    table = Table(
        title=f"{title}: × = speedup over the fastest BSP form",
        caption="every entry: a wider terminal, or the JSON file",
        box=box.SIMPLE,
    )
    table.add_column("problem", no_wrap=True)
    table.add_column("BSP ms", justify="right")
    table.add_column("fastest", no_wrap=True)
    for col in ("×", "dispatch", "ceiling"):
        table.add_column(col, justify="right")
    for row in report["rows"]:
        head = _head(row, dtype=len(dtypes) > 1, op=len(ops) > 1)
        if "error" in row:
            table.add_row(head, row["error"], "", "", "", "")
            continue
        bsp = bsp_us(row)
        fastest = fastest_entry(row)
        dispatch, ceiling = best_us(row.get("dispatch")), ceiling_us(row)
        name, t = fastest if fastest is not None else ("-", None)
        served = f"{_ratio(bsp, dispatch)} {served_text(row)}".rstrip()
        table.add_row(head, _cell(bsp, None), name, _ratio(bsp, t), served, _ratio(bsp, ceiling))
    return table


def _ratio(bsp: float | None, us: float | None) -> str:
    return f"{SPEEDUP}{bsp / us:.2f}" if bsp and us else "-"


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command to the root app."""
    app.command("bench")(bench_command)
