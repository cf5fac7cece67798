"""How the tuner reports: a rich live display, plain lines (``--quiet``) or JSON lines (``--jsonl``).

Every reporter gets the same events: ``note`` (a message), ``shape_start``, ``trial``, ``shape_done`` and
``finish`` (the summary, with per-trial overhead beyond the timed runs and trials per minute).

A speedup is printed only where it was confirmed (:attr:`ShapeResult.confirmed`: the winner and the forms
re-timed side by side when the key's search ended); while trials run, the best trial's time and the fastest
BSP form's trial time are shown side by side, without a ratio.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO


def _speedup(bsp_us: float | None, us: float | None) -> float | None:
    """BSP's time over ``us`` (None where either is missing or zero)."""
    return bsp_us / us if bsp_us and us else None


@dataclass(frozen=True)
class TrialEvent:
    """One finished (or pruned) trial of shape ``shape_index`` (1-based) of ``n_shapes``."""

    shape_index: int
    n_shapes: int
    key: str
    trial: int  # launched trials finished so far for this shape, this one included
    trials: int  # the target
    number: int  # Optuna's trial number
    variant: str
    params: dict[str, Any]
    state: str  # COMPLETE, FAIL or PRUNED
    median_us: float | None = None
    rel_err: float | None = None
    failure: str | None = None
    best_us: float | None = None
    bsp_us: float | None = None
    wall_ms: float = 0.0
    overhead_ms: float | None = None
    #: of the overhead, the slowest rank's workspace set-up, and its first call (compiling a new
    #: configuration) with the reference check
    prepare_ms: float | None = None
    check_ms: float | None = None


@dataclass(frozen=True)
class ShapeResult:
    """The outcome of one shape: the winner (if any; ``median_us`` its time, ``bsp_us`` the fastest BSP
    form's: the confirmation's where ``confirmed``, else the best trials') and the study's trial counts over
    every run of it."""

    key: str
    variant: str | None
    params: dict[str, Any]
    median_us: float | None
    bsp_us: float | None
    trials: int  # finished (COMPLETE + FAIL) in the study, all runs together
    failed: int
    pruned: int
    ran: int  # trials launched by this invocation
    wall_s: float
    stored: bool
    note: str = ""
    overheads_ms: tuple[float, ...] = field(default=(), repr=False)
    confirmed: bool = False

    @property
    def speedup(self) -> float | None:
        """The fastest BSP form's time over the winner's, where confirmed (else None: not shown)."""
        return _speedup(self.bsp_us, self.median_us) if self.confirmed else None


@dataclass(frozen=True)
class Summary:
    """Totals of one tuner invocation."""

    shapes: int
    trials_run: int
    wall_s: float
    group_launches: int
    launch_s: float
    mean_overhead_ms: float | None
    median_overhead_ms: float | None
    trials_per_min: float | None


def summarize(results: list[ShapeResult], wall_s: float, launches: int, launch_s: float) -> Summary:
    """Totals over ``results``; trials/min excludes group launch time."""
    overheads = sorted(o for r in results for o in r.overheads_ms)
    ran = sum(r.ran for r in results)
    busy = max(wall_s - launch_s, 1e-9)
    return Summary(
        shapes=len(results),
        trials_run=ran,
        wall_s=wall_s,
        group_launches=launches,
        launch_s=launch_s,
        mean_overhead_ms=sum(overheads) / len(overheads) if overheads else None,
        median_overhead_ms=overheads[len(overheads) // 2] if overheads else None,
        trials_per_min=ran * 60.0 / busy if ran else None,
    )


def _us(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:,.1f} µs"


def _x(v: float | None) -> str:
    """A confirmed speedup, ``-`` where there is none (unconfirmed speedups are never printed)."""
    return "-" if v is None else f"{v:.2f}×"


class Reporter:
    """Base reporter: ignores every event."""

    def note(self, text: str) -> None:
        pass

    def shape_start(self, index: int, n_shapes: int, key: str, trials: int, done: int) -> None:
        pass

    def trial(self, ev: TrialEvent) -> None:
        pass

    def shape_done(self, index: int, n_shapes: int, result: ShapeResult) -> None:
        pass

    def finish(self, results: list[ShapeResult], summary: Summary) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlReporter(Reporter):
    """One JSON object per event on ``stream`` (stdout by default), flushed at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, obj: dict[str, Any]) -> None:
        self.stream.write(json.dumps(obj, default=str) + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        self._emit({"event": "note", "message": text})

    def shape_start(self, index: int, n_shapes: int, key: str, trials: int, done: int) -> None:
        self._emit(
            {
                "event": "shape_start",
                "shape": index,
                "n_shapes": n_shapes,
                "key": key,
                "trials": trials,
                "done": done,
            }
        )

    def trial(self, ev: TrialEvent) -> None:
        self._emit({"event": "trial", **asdict(ev)})

    def shape_done(self, index: int, n_shapes: int, result: ShapeResult) -> None:
        d = asdict(result)
        d.pop("overheads_ms")
        self._emit(
            {"event": "shape_done", "shape": index, "n_shapes": n_shapes, **d, "speedup": result.speedup}
        )

    def finish(self, results: list[ShapeResult], summary: Summary) -> None:
        self._emit({"event": "summary", **asdict(summary)})


class PlainReporter(Reporter):
    """One line per shape and the summary, for logs (``--quiet``); with ``trials`` also a line as each
    shape starts and one per trial (progress where no live display can be drawn: a log, a pipe). Lines
    fit ``$COLUMNS`` (80 when unset): keys in their short form, long notes wrapped."""

    def __init__(self, stream: TextIO | None = None, trials: bool = False) -> None:
        import shutil

        self.stream = stream or sys.stderr
        self.trials = trials
        self.width = shutil.get_terminal_size((80, 24)).columns

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        self._print(_wrap(text, self.width))

    def shape_start(self, index: int, n_shapes: int, key: str, trials: int, done: int) -> None:
        if self.trials:
            self._print(f"[{index}/{n_shapes}] {_short(key)}: {done} of {trials} trials done")

    def trial(self, ev: TrialEvent) -> None:
        if self.trials and ev.state == "COMPLETE":  # pruned ones never launched: no line
            self._print(
                f"  trial {ev.trial}/{ev.trials} {ev.variant} {_us(ev.median_us)}; best {_us(ev.best_us)}, "
                f"bsp {_us(ev.bsp_us)}"
            )
        if ev.state == "FAIL":
            text = f"  trial {ev.number} of {_short(ev.key)}, {ev.variant}, failed: {ev.failure}"
            self._print(_wrap(text, self.width))

    def shape_done(self, index: int, n_shapes: int, result: ShapeResult) -> None:
        winner = f"{result.variant or 'no winner'} {_us(result.median_us)}"
        self._print(f"[{index}/{n_shapes}] {_short(result.key)}: {winner}")
        self._print(
            f"  bsp {_us(result.bsp_us)}, {_x(result.speedup)}; trials={result.trials} failed={result.failed}"
            + (f" {result.note}" if result.note else "")
        )

    def finish(self, results: list[ShapeResult], summary: Summary) -> None:
        self._print(_summary_line(summary))


def _short(key: str) -> str:
    """``ag_gemm bf16 M=8 N=8192 K=8192 gd=0``: a key text without GPU and world size (said once, in the
    run's notes) in the short form of :attr:`ProblemKey.short_text`."""
    from .._problem import ProblemKey

    try:
        parsed = ProblemKey.from_text(key)
    except ValueError:
        return key
    return f"{parsed.op} {parsed.short_text}"


def _wrap(text: str, width: int) -> str:
    """``text`` wrapped at ``width`` with an indented continuation; a label and one long word (a URL,
    a path) stay on one line, so they can be copied."""
    import textwrap

    if len(text) <= width or len(text.split()) <= 2:
        return text
    return textwrap.fill(text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def _summary_line(s: Summary) -> str:
    if s.trials_run == 0:
        return f"{s.shapes} shape(s) already tuned, no trial to run (--retune to start over)"
    over = (
        "-"
        if s.mean_overhead_ms is None
        else f"{s.mean_overhead_ms:.0f} ms mean, {s.median_overhead_ms:.0f} ms median"
    )
    rate = "-" if s.trials_per_min is None else f"{s.trials_per_min:.0f}"
    return (
        f"{s.shapes} shape(s), {s.trials_run} trial(s) in {s.wall_s:.1f} s, {rate} trials/min; "
        f"group launched {s.group_launches}× ({s.launch_s:.1f} s)\n"
        f"overhead per trial beyond the timed runs: {over}"
    )


class RichReporter(Reporter):
    """Live progress (shape i of n, trial j of T, best so far beside BSP's) and a summary table."""

    def __init__(self, wide: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.out = Console()
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.shapes_task = None
        self.trials_task = None
        self.wide = wide
        self.progress.start()

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def shape_start(self, index: int, n_shapes: int, key: str, trials: int, done: int) -> None:
        if self.shapes_task is None:
            self.shapes_task = self.progress.add_task("shapes", total=n_shapes)
            self.trials_task = self.progress.add_task("trials", total=trials)
        self.progress.update(
            self.shapes_task, completed=index - 1, description=f"shape {index}/{n_shapes} {key}"
        )
        self.progress.update(self.trials_task, total=trials, completed=done, description="trials")

    def trial(self, ev: TrialEvent) -> None:
        desc = f"trial {ev.trial}/{ev.trials} best {_us(ev.best_us)}, bsp {_us(ev.bsp_us)}"
        self.progress.update(self.trials_task, completed=ev.trial, description=desc)
        if ev.state == "FAIL":
            self.progress.console.print(f"  trial {ev.number} {ev.variant} failed: {ev.failure}")

    def shape_done(self, index: int, n_shapes: int, result: ShapeResult) -> None:
        self.progress.update(self.shapes_task, completed=index)
        self.progress.console.print(
            f"[{index}/{n_shapes}] {result.key}: {result.variant or 'no winner'} {_us(result.median_us)} "
            f"({_x(result.speedup)} vs bsp)"
        )

    def finish(self, results: list[ShapeResult], summary: Summary) -> None:

        self.close()
        self.out.print(summary_table(results, self.wide))
        self.out.print(_summary_line(summary))

    def close(self) -> None:
        self.progress.stop()


def summary_table(results: list[ShapeResult], wide: bool = False) -> Any:
    """The winners of a run: problem, winner, time and speedup (fits 80 columns); ``wide`` adds BSP's
    time, the trial counts and the parameters, with the full key text."""
    from rich import box
    from rich.table import Table

    from .._problem import ProblemKey

    keys = [ProblemKey.from_text(r.key) for r in results]
    where = sorted({f"{k.op} on {k.gpu_model}, world size {k.world_size}" for k in keys})
    table = Table(title=f"autotaxer tune: {'; '.join(where)}", box=box.SIMPLE_HEAD)
    table.add_column("problem", no_wrap=True)
    table.add_column("winner", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("×BSP", justify="right", no_wrap=True)
    if wide:
        for col in ("bsp", "trials", "failed", "params"):
            table.add_column(col)
    for key, r in zip(keys, results, strict=True):
        row = [key.text if wide else key.short_text, r.variant or "-", _us(r.median_us), _x(r.speedup)]
        if wide:
            row += [_us(r.bsp_us), str(r.trials), str(r.failed), json.dumps(r.params)]
        table.add_row(*row)
    return table
