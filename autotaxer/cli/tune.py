"""``autotaxer tune``: tune every shape of a shapes file on a worker group and store the winners.

Started alone it spawns one process per rank (``--device cuda``: NCCL, one GPU each; ``cpu``: gloo).
Started by ``torchrun``/``srun`` (``RANK``/``WORLD_SIZE`` set) it uses the launch's ranks instead: rank 0
tunes, the others follow (see ``autotaxer/tuner/distributed.py``). Re-running the same command resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .._problem import MAX_WORLD_SIZE
from ..measure import CHAINS
from ..ops._symm_backend import CHOICES as SYMM_MEM_CHOICES
from ._common import (
    TIMINGS,
    DbOption,
    DeviceOption,
    ShapesOption,
    VariantsOption,
    WorldSizeOption,
    YesOption,
    choice,
    flag,
    load_rows,
    variant_names,
)


def tune_command(
    world_size: WorldSizeOption,
    shapes: ShapesOption,
    op: Annotated[
        str | None, typer.Option("--op", help="Only the rows of this op (default: every row).")
    ] = None,
    db: DbOption = None,
    trials: Annotated[
        int, typer.Option("--trials", help="Launched trials per shape (grid: every point).")
    ] = 32,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds per shape (default: no limit).")
    ] = None,
    trial_timeout: Annotated[
        float, typer.Option("--trial-timeout", help="Watchdog seconds per trial.")
    ] = 120.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampler and input seed.")] = 0,
    sampler: Annotated[str, choice("--sampler", ("tpe", "random", "grid"), help="grid: exhaustive.")] = "tpe",
    device: DeviceOption = "auto",
    variants: VariantsOption = None,
    sampled: Annotated[
        int | None,
        typer.Option(
            "--sampled",
            help="Trials the sampler draws after the queued ones (BSP forms, warm starts, seeds): a shape's "
            "budget is at least those plus this many (default: 8 on GPUs, 0 on CPU).",
        ),
    ] = None,
    reach: Annotated[
        float | None,
        typer.Option(
            "--reach",
            help="Prune a sampler draw of a variant whose fastest trial is this many times the shape's "
            "fastest (its seeds ran; 0: never; default: 1.25 on GPUs, 0 on CPU).",
        ),
    ] = None,
    retune: Annotated[bool, flag("--retune", help="Delete the studies and winners first.")] = False,
    quiet: Annotated[
        bool, flag("--quiet", "-q", help="Plain log lines instead of the live display.")
    ] = False,
    jsonl: Annotated[bool, flag("--jsonl", help="JSON lines on stdout, one per event.")] = False,
    wide: Annotated[bool, flag("--wide", help="Summary with full keys, BSP times and parameters.")] = False,
    timing: Annotated[
        str, choice("--timing", TIMINGS, help="Back-to-back calls, or replays of a CUDA graph.")
    ] = "eager",
    chain: Annotated[
        str,
        choice(
            "--chain",
            CHAINS,
            help="dependent: each timed call waits for the previous call's output, as a model's next layer "
            "does (the link's own cost subtracted); back-to-back: independent calls, which may overlap.",
        ),
    ] = "dependent",
    warm_start: Annotated[
        list[Path] | None,
        typer.Option(
            "--warm-start",
            metavar="<path>",
            help="Table file whose records of the tuned keys run first (e.g. after a kernel change); "
            "repeat for several.",
        ),
    ] = None,
    symm_mem: Annotated[
        str | None,
        choice(
            "--symm-mem",
            SYMM_MEM_CHOICES,
            help="Symmetric-memory backend: cuda (torch's fused ops; default) or nccl (NCCL's windows).",
        ),
    ] = None,
    yes: YesOption = False,
) -> None:
    """Tune every shape of a shapes file and store the winners.

    Resumable: the same command goes on where a run stopped; --retune starts over. Without GPUs the CPU
    pipeline runs (records for gpu_model cpu, never served to GPUs).
    """
    from ..measure import TimingConfig
    from ..tuner.distributed import launch_env
    from ..tuner.run import TuneConfig

    if symm_mem is not None:  # one of SYMM_MEM_CHOICES (the option checks)
        from ..ops._symm_backend import select

        select(symm_mem)  # before any worker starts: they inherit it
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        _fail(f"--world-size: must be between 1 and {MAX_WORLD_SIZE}, got {world_size}")
    launch = launch_env()
    if launch is not None and launch.world_size != world_size:
        _fail(f"--world-size {world_size} but this launch has WORLD_SIZE={launch.world_size}")
    keys_rows = _load_rows(shapes, world_size, op)
    config = TuneConfig(  # completed for the device once it is known (_for_device)
        trials=trials,
        timeout_s=timeout,
        trial_timeout_s=trial_timeout,
        timing=TimingConfig(mode=timing, chain=chain),
        seed=seed,
        sampler=sampler,
        variants=variant_names(variants),
        warm_start=_warm_start(warm_start or []),
        retune=retune,
    )
    output = (quiet, jsonl, wide)
    if launch is None:
        _tune_spawned(keys_rows, world_size, device, db, config, (sampled, reach), output, yes)
    else:
        _tune_launched(keys_rows, launch, device, db, config, (sampled, reach), output)


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load_rows(path: Path, world_size: int, op: str | None) -> list[Any]:
    from ..shapes import ShapesError

    try:
        rows = load_rows(path, world_size)
    except (ShapesError, ValueError, OSError) as e:
        _fail(str(e))
    if op is not None:
        rows = [r for r in rows if r.op == op]
    if not rows:
        _fail(f"{path}: no shapes to tune" + (f" for op {op!r}" if op else ""))
    return rows


def _warm_start(paths: list[Path]) -> dict[str, tuple[tuple[str, dict], ...]]:
    """Key text -> the (variant, params) of every record of those keys in the table files ``paths``."""
    from ..table_file import TableFileError, read_table

    warm: dict[str, list[tuple[str, dict]]] = {}
    for path in paths:
        try:
            records = read_table(path)
        except TableFileError as e:
            _fail(f"--warm-start: {e}")
        for rec in records:
            warm.setdefault(rec.key.text, []).append((rec.variant, dict(rec.params)))
    return {k: tuple(v) for k, v in warm.items()}


def _for_device(config: Any, chosen: tuple[int | None, float | None], device_type: str) -> Any:
    """``config`` with the device's timing defaults, ``--sampled`` and ``--reach`` (``chosen``; defaults:
    8 and 1.25 on GPUs, 0 and 0 on CPU, where a trial costs no compilation and the CPU tests count draws),
    validated."""
    from dataclasses import replace

    from ..measure import TimingConfig

    mode = config.timing.mode
    if device_type == "cpu" and mode == "graph":
        _fail("--timing graph needs CUDA; use --timing eager on CPU")
    from ..tuner.study import search_defaults

    default_sampled, default_reach = search_defaults(device_type)
    sampled, reach = chosen
    sampled = default_sampled if sampled is None else sampled
    reach = default_reach if reach is None else reach
    timing = TimingConfig.for_device(device_type, mode, config.timing.chain)
    config = replace(config, sampled=sampled, reach=reach, timing=timing)
    try:
        config.validate()
    except ValueError as e:
        _fail(str(e))
    return config


def _keys(rows: list[Any], target: Any, world_size: int, config: Any) -> list[Any]:
    """Problem keys of ``rows`` on ``target``; bad ``--variants`` fail here, before the database opens."""
    from .._target import memory_per_rank
    from ..ops import get_op
    from ..shapes import ShapesError
    from ..tuner.study import SearchSpace

    keys = [row.to_key(target.gpu_model, world_size) for row in rows]
    capacity = memory_per_rank(target, world_size)
    for row, key in zip(rows, keys, strict=True):
        op = get_op(key.op)
        need = op.bytes_per_rank(key)
        if need > capacity:  # refused before any launch: every trial would fail to allocate
            where = (
                "the GPU"
                if target.device_type == "cuda"
                else f"the CPU's memory shared by {world_size} ranks"
            )
            _fail(str(ShapesError(row.source, row.line, op.shape_fields[0], (
                f"needs about {need / 2**30:.1f} GiB per rank (inputs, output and the fp32 reference), "
                f"{where} has {capacity / 2**30:.1f} GiB"))))  # fmt: skip
        try:
            SearchSpace.build(op, key, target, config.variants)
        except ValueError as e:
            _fail(str(e))
    return keys


def _reporter(quiet: bool, jsonl: bool, wide: bool) -> Any:
    """JSON lines, plain shape lines (``--quiet``), the live display on a terminal, else (a log, a pipe)
    plain lines for every trial, so a long run shows progress where no live display can."""
    import sys

    from ..tuner.progress import JsonlReporter, PlainReporter, RichReporter

    if jsonl:
        return JsonlReporter()
    if quiet:
        return PlainReporter()
    return RichReporter(wide) if sys.stdout.isatty() else PlainReporter(sys.stdout, trials=True)


def _open_db(url: str | None) -> Any:
    from ..storage import DatabaseError, open_database

    try:
        return open_database(url)
    except DatabaseError as e:
        _fail(str(e))


def _run(keys: list[Any], target: Any, database: Any, config: Any, executor: Any, reporter: Any) -> None:
    from sqlalchemy.exc import DBAPIError

    from ..storage import DatabaseError
    from ..tuner import GroupError, tune
    from ..tuner.study import StudyError

    try:
        results, _ = tune(keys, target, database, config, executor, reporter)
    except (StudyError, ValueError, DatabaseError) as e:
        reporter.close()
        _fail(str(e))
    except DBAPIError as e:  # the database failed mid-run (a full disk, a lost server): nothing is lost
        reporter.close()
        _fail(
            f"{database.display_url}: {e.orig}; the running trial is marked interrupted and every "
            "finished one is kept: fix the cause and re-run the same command to resume",
            code=1,
        )
    except GroupError as e:
        reporter.close()
        _fail(f"worker group: {e}", code=1)
    except KeyboardInterrupt:
        reporter.close()
        _fail("interrupted; re-run the same command to resume", code=130)
    missing = [r.key for r in results if not r.stored]
    if missing:
        _fail(f"no winner stored for {len(missing)} shape(s): {', '.join(missing)}", code=1)


def _tune_spawned(rows, world_size, device, db_url, config, chosen, output, yes: bool) -> None:
    from .._target import detect_target, visible_gpus
    from ..tuner import SpawnedGroup
    from ._estimate import tune_verdict

    if device == "auto" and 0 < (visible := visible_gpus()) < world_size:
        _fail(
            f"--world-size {world_size} needs {world_size} GPUs, {visible} visible; tune at "
            f"--world-size {visible} or less, or pass --device cpu for the CPU pipeline (its records are "
            "stored for gpu_model 'cpu' and never served to GPUs)"
        )
    try:
        target = detect_target(device, world_size)
    except (RuntimeError, ValueError) as e:
        _fail(str(e))
    config = _for_device(config, chosen, target.device_type)
    keys = _keys(rows, target, world_size, config)
    found = tune_verdict(keys, config.trials, world_size, yes) if target.device_type == "cpu" else None
    if found is not None and found[0] == "refuse":
        _fail(found[1])
    reporter = _reporter(*output)
    if device == "auto" and target.device_type == "cpu":
        reporter.note(
            "--device auto: no GPU visible, running the CPU pipeline "
            "(records are stored for gpu_model 'cpu' and never served to GPUs)"
        )
    if found is not None:
        reporter.note(found[1])
    database = _open_db(db_url)
    reporter.note(f"database: {database.display_url}")
    group = SpawnedGroup(world_size, target.device_type)
    try:
        _run(keys, target, database, config, group, reporter)
    finally:
        group.close()
        database.close()


def _tune_launched(rows, launch, device, db_url, config, chosen, output) -> None:
    import torch

    from ..tuner.distributed import LaunchedGroup, follow, init_launched

    if device == "auto":
        device = (
            "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > launch.local_rank else "cpu"
        )
    ctx = init_launched(launch, device)
    if launch.rank != 0:
        follow(ctx)
        return
    config = _for_device(config, chosen, device)
    keys = _keys(rows, ctx.target, launch.world_size, config)
    reporter = _reporter(*output)
    database = _open_db(db_url)
    reporter.note(f"database: {database.display_url}")
    group = LaunchedGroup(ctx)
    try:
        _run(keys, ctx.target, database, config, group, reporter)
    except typer.Exit:
        group.stop()  # a clean end with an error message: release the followers
        raise
    else:
        group.stop()
    finally:
        database.close()


def register(app: typer.Typer) -> None:
    """Add the ``tune`` command to the root app."""
    app.command("tune")(tune_command)
