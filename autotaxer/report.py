"""``autotaxer report``: bench results and the tuning database as one self-contained HTML page + PNGs.

Sections: per bench results file, a table and one plot per (dtype, N, K, layout) of the speedup over BSP
against M for every entry, with the ceiling (BSP / max(all-gather alone, GEMM alone)) drawn, and a map of
which entry wins at each M; per (GPU, world size) of the database, the stored winners as a table, a
speedup plot per (dtype, N, K, layout) and a winner map; per Optuna study, its optimization history and
(with enough COMPLETE trials) its parameter importances. The PNGs are written beside the page and
embedded in it as base64, so the page needs nothing else.

matplotlib (the ``report`` extra) is imported only when a report is built.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .benchmark.rows import best_us, bsp_us, case_fields, ceiling_us, comm_entry, compute_entry, row_entries

#: Fewer COMPLETE trials than this and a study gets no importance plot (the estimate is noise).
MIN_TRIALS_FOR_IMPORTANCE = 5
_SLUG_RE = re.compile(r"[^A-Za-z0-9]+")


class ReportError(ValueError):
    """Unusable input (a malformed results file, matplotlib missing); the message names the file."""


@dataclass(frozen=True)
class BenchRun:
    """One bench results file: where it was measured and its rows."""

    path: str
    device: str
    world_size: int | None
    date: str
    versions: Mapping[str, Any]
    command: str
    rows: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Figure:
    """One plot: its file name, caption and PNG bytes."""

    name: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote."""

    html_path: Path
    png_paths: tuple[Path, ...]
    notes: tuple[str, ...] = ()


@dataclass
class _Page:
    sections: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_figure(self, name: str, caption: str, fig: Any) -> Figure:
        """Render the matplotlib figure ``fig`` as the page's PNG ``name``; returns it."""
        rendered = Figure(name, caption, _png(fig))
        self.figures.append(rendered)
        return rendered


# -- inputs ---------------------------------------------------------------------------------------------


def load_bench_file(path: str | os.PathLike[str]) -> BenchRun:
    """Parse one results file of :func:`autotaxer.benchmark.run.run_bench`; ``ReportError`` names a field."""
    name = os.fspath(path)
    try:
        data = json.loads(Path(name).read_text())
    except OSError as e:
        raise ReportError(f"{name}: cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{name}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ReportError(f"{name}: field 'rows': missing; not an autotaxer bench results file")
    for i, row in enumerate(data["rows"]):
        if not isinstance(row, dict):
            raise ReportError(f"{name}: rows[{i}]: expected an object")
        try:
            fields = _sweep_fields(row)
        except KeyError as e:
            raise ReportError(f"{name}: rows[{i}]: field 'op': {e.args[0]}") from None
        for f in fields:
            if isinstance(row.get(f), bool) or not isinstance(row.get(f), int):
                raise ReportError(f"{name}: rows[{i}]: field {f!r}: expected an integer, got {row.get(f)!r}")
        for f in ("bsp", "allgather", "reduce_scatter", "gemm", "variants"):
            if f in row and not isinstance(row[f], dict):
                raise ReportError(f"{name}: rows[{i}]: field {f!r}: expected an object")
    ws = data.get("world_size", (data.get("config") or {}).get("world_size"))
    return BenchRun(
        path=name,
        device=str(data.get("device", "?")),
        world_size=ws if isinstance(ws, int) else None,
        date=str(data.get("date", "?")),
        versions=data.get("versions") if isinstance(data.get("versions"), dict) else {},
        command=str(data.get("command", "")),
        rows=tuple(data["rows"]),
    )


def load_bench_results(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[BenchRun], list[str]]:
    """Bench runs from files and folders, and notes on skipped files.

    A file given by name must be a bench results file; in a folder, ``*.json`` files of other formats
    are skipped with a note.
    """
    runs, notes = [], []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in sorted(path.glob("*.json")):
                try:
                    runs.append(load_bench_file(f))
                except ReportError as e:
                    notes.append(f"skipped {e}")
        else:
            runs.append(load_bench_file(path))
    return runs, notes


# -- plots ------------------------------------------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ReportError(
            "autotaxer report needs matplotlib: pip install 'autotaxer[report]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _slug(*parts: Any) -> str:
    return _SLUG_RE.sub("-", "_".join(str(p) for p in parts)).strip("-").lower()


def _label_line_plot(ax: Any, title: str, xlabel: str, ylabel: str, title_size: int) -> None:
    """Axis labels, the title, a light grid and a small legend: how the line plots of the page look."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_size)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _speedup_figure(
    title: str, series: Mapping[str, list[tuple[int, float]]], ceiling: list[tuple[int, float]]
):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, points in series.items():
        if points:
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
    if ceiling:
        xs, ys = zip(*sorted(ceiling), strict=True)
        # a marker too: a group of one M is one point, which a dashed line alone does not draw
        ax.plot(
            xs, ys, "k--", marker="_", markersize=16, linewidth=1.5, label="ceiling: BSP / slowest part alone"
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    _label_line_plot(ax, title, "M (global rows)", "speedup over BSP (faster mode each)", title_size=10)
    return fig


def _winner_map_figure(title: str, cells: list[tuple[str, int, str]]):
    """``cells``: (group label, M, winner name) points, one color per winner."""
    plt = _pyplot()
    groups = list(dict.fromkeys(g for g, _, _ in cells))
    names = list(dict.fromkeys(w for _, _, w in cells))
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(groups)))
    for j, name in enumerate(names):
        pts = [(m, groups.index(g)) for g, m, w in cells if w == name]
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, s=120, marker="s", color=colors(j % 10), label=name)
    ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylim(-0.7, len(groups) - 0.3)
    ax.set_xlabel("M (global rows)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _history_figure(title: str, trials: list[tuple[int, float, str]]):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    variants = list(dict.fromkeys(v for _, _, v in trials))
    colors = plt.get_cmap("tab10")
    for j, v in enumerate(variants):
        pts = [(n, val) for n, val, var in trials if var == v]
        xs, ys = zip(*pts, strict=True)
        ax.scatter(xs, ys, s=18, color=colors(j % 10), label=v)
    best, line = math.inf, []
    for n, val, _ in sorted(trials):
        best = min(best, val)
        line.append((n, best))
    xs, ys = zip(*line, strict=True)
    ax.step(xs, ys, where="post", color="black", linewidth=1.2, label="best so far")
    ax.set_yscale("log")
    _label_line_plot(ax, title, "trial number", "median time (µs)", title_size=9)
    return fig


def _importance_figure(title: str, importances: Mapping[str, float]):
    plt = _pyplot()
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * len(items)))
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax.set_xlabel("importance (fANOVA)")
    ax.set_title(title, fontsize=9)
    return fig


# -- sections -------------------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1e3:.3f}"


def _sweep_fields(row: Any) -> list[str]:
    """The shape fields of a row's op (``KeyError`` for an unknown op); the first is the one plotted
    along the x axis (M of a GEMM: the dimension a model's batch and sequence change)."""
    from .ops import DEFAULT_OP, get_op

    return list(get_op(row.get("op") or DEFAULT_OP).shape_fields)


def _group_label(op: str, dtype: Any, fields: dict[str, Any]) -> str:
    """The plot a row or record belongs to: its op, dtype and every field but the swept one."""
    from ._problem import IMPLICIT_LAYOUT, SHORT_LAYOUT

    words = [
        str(v) if isinstance(v, str) else f"{SHORT_LAYOUT.get(f, f)}={v}"
        for f, v in list(fields.items())[1:]
        if IMPLICIT_LAYOUT.get(f) != v
    ]
    return " ".join([op, str(dtype), *words])


def _bench_section(run: BenchRun, index: int, page: _Page) -> None:
    ws = "?" if run.world_size is None else run.world_size
    meta = _table(
        ("device", "world size", "date", "versions", "command"),
        [(run.device, ws, run.date, ", ".join(f"{k} {v}" for k, v in run.versions.items()), run.command)],
    )
    names: list[str] = []
    for row in run.rows:
        names += [n for n, e in row_entries(row).items() if n not in names and "skipped" not in e]
    table_rows, groups, wins = [], {}, []
    for row in run.rows:
        fields = case_fields(row)
        sweep = next(iter(fields.values()))
        head = [row.get("op", "?"), row.get("dtype", "?"), " ".join(f"{f}={v}" for f, v in fields.items())]
        if "error" in row:
            table_rows.append([*head, f"error: {row['error']}", *[""] * (3 + len(names))])
            continue
        bsp = bsp_us(row)
        ceiling = ceiling_us(row)
        entries = row_entries(row)
        cells = [_ms(bsp), _ms(best_us(comm_entry(row))), _ms(best_us(compute_entry(row)))]
        cells.append(f"{bsp / ceiling:.2f}×" if bsp and ceiling else "-")
        for n in names:
            t = best_us(entries.get(n))
            cells.append("" if n not in entries else ("fail" if t is None else f"{_ms(t)} ({bsp / t:.2f}×)"))
        table_rows.append([*head, *cells])
        if not bsp:
            continue
        label = _group_label(str(head[0]), head[1], fields)
        g = groups.setdefault(label, {"series": {}, "ceiling": []})
        if ceiling:
            g["ceiling"].append((sweep, bsp / ceiling))
        timed = {"bsp": bsp}
        for n, e in entries.items():
            t = best_us(e)
            if t is not None:
                g["series"].setdefault(n, []).append((sweep, bsp / t))
                timed[n] = t
        wins.append((label, sweep, min(timed, key=timed.get)))
    header = ("op", "dtype", "problem", "BSP ms", "comm ms", "compute ms", "ceiling", *names)
    parts = [f"<h2>Bench results: {_esc(os.path.basename(run.path))}</h2>", meta, _table(header, table_rows)]
    base = _slug("bench", index, Path(run.path).stem)
    for label, g in groups.items():
        title = f"{run.device} ×{ws}, {label}"
        fig = _speedup_figure(title, g["series"], g["ceiling"])
        parts.append(_img(page.add_figure(f"{base}_{_slug(label)}.png", f"speedup over BSP: {title}", fig)))
    if wins:
        title = f"{run.device} ×{ws}: fastest entry per M (including BSP)"
        parts.append(_img(page.add_figure(f"{base}_winners.png", title, _winner_map_figure(title, wins))))
    page.sections.append("\n".join(parts))


def _winners_section(winners: Sequence[Any], page: _Page) -> None:
    by_machine: dict[tuple[str, int], list[Any]] = {}
    for rec in winners:
        by_machine.setdefault((rec.key.gpu_model, rec.key.world_size), []).append(rec)
    for (gpu, ws), recs in by_machine.items():
        rows = [
            (
                r.key.text,
                r.variant,
                json.dumps(dict(r.params)),
                f"{r.median_us:.1f}",
                f"{r.bsp_us:.1f}",
                f"{r.speedup:.2f}×",
                r.trials,
                r.measured_at.isoformat(timespec="seconds"),
                ", ".join(f"{k} {v}" for k, v in r.env.items() if k in ("torch", "triton", "iris")),
            )
            for r in recs
        ]
        header = (
            "key",
            "variant",
            "params",
            "median µs",
            "BSP µs",
            "speedup",
            "trials",
            "measured",
            "versions",
        )
        parts = [f"<h2>Tuning database: {_esc(gpu)} ×{ws}</h2>", _table(header, rows)]
        groups: dict[str, dict[str, list[tuple[int, float]]]] = {}
        wins = []
        for r in recs:
            fields = {**dict(r.key.shape), **dict(r.key.layout)}
            m = next(iter(fields.values()))
            label = _group_label(r.key.op, r.key.dtype, fields)
            groups.setdefault(label, {}).setdefault(r.variant, []).append((m, r.speedup))
            wins.append((label, m, r.variant))
        base = _slug("db", gpu, ws)
        for label, series in groups.items():
            title = f"tuned winners {gpu} ×{ws}, {label}"
            fig = _speedup_figure(title, {f"winner: {v}": pts for v, pts in series.items()}, [])
            parts.append(_img(page.add_figure(f"{base}_{_slug(label)}.png", title, fig)))
        if wins:
            title = f"{gpu} ×{ws}: tuned winner per M"
            parts.append(_img(page.add_figure(f"{base}_winners.png", title, _winner_map_figure(title, wins))))
        page.sections.append("\n".join(parts))


def _studies_section(storage: Any, page: _Page) -> None:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = sorted(optuna.get_all_study_names(storage))
    if not names:
        return
    parts = ["<h2>Optuna studies</h2>"]
    for i, name in enumerate(names):
        study = optuna.load_study(study_name=name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no trials"
        parts.append(f"<h3>{_esc(name)}</h3><p>{_esc(summary)}</p>")
        if not done:
            parts.append("<p>No COMPLETE trial: nothing to plot.</p>")
            continue
        best = min(done, key=lambda t: t.value)
        parts.append(f"<p>best: {best.value:.1f} µs, {_esc(json.dumps(best.params))}</p>")
        base = _slug("study", i)
        pts = [(t.number, float(t.value), str(t.params.get("variant", "?"))) for t in done]
        title = f"optimization history: {name}"
        parts.append(_img(page.add_figure(f"{base}_history.png", title, _history_figure(title, pts))))
        note = _importances(study, done, name, base, page)
        if note is not None:
            parts.append(f"<p>Parameter importances: {_esc(note)}</p>")
            page.notes.append(f"{name}: {note}")
        else:
            parts.append(_img(page.figures[-1]))
    page.sections.append("\n".join(parts))


def _importances(study: Any, done: list[Any], name: str, base: str, page: _Page) -> str | None:
    """Add an importance plot; or say why there is none. Optuna's warnings about the estimate (too few
    trials per parameter value) become one note of the report instead of lines on the terminal."""
    import warnings

    import optuna

    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        return f"skipped: {len(done)} COMPLETE trial(s), at least {MIN_TRIALS_FOR_IMPORTANCE} needed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            importances = optuna.importance.get_param_importances(study)
        except (RuntimeError, ValueError) as e:
            return f"skipped: {e}"
    importances = {k: v for k, v in importances.items() if math.isfinite(v)}
    if not importances:
        return "skipped: no parameter varies across the COMPLETE trials"
    title = f"parameter importances: {name}"
    page.add_figure(f"{base}_importance.png", title, _importance_figure(title, importances))
    if caught:
        page.notes.append(f"{name}: importances from few trials per parameter value, may be inaccurate")
    return None


def _img(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (
        f'<figure><img alt="{_esc(f.caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_esc(f.caption)} ({_esc(f.name)})</figcaption></figure>"
    )


_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f0f0f0; }
figure { display: inline-block; margin: 0.5em; }
figcaption { font-size: 0.8em; color: #555; }
"""


def build_page(
    runs: Sequence[BenchRun], db: Any = None, notes: Sequence[str] = ()
) -> tuple[str, list[Figure], list[str]]:
    """The HTML text, its figures and notes for ``runs`` and (optionally) an open tuning database."""
    _pyplot()
    page = _Page(notes=list(notes))
    for i, run in enumerate(runs):
        _bench_section(run, i, page)
    if db is not None:
        _winners_section(db.winners(), page)
        storage = db.optuna_storage()
        if storage is not None:  # a database with only imported winners has no studies
            _studies_section(storage, page)
    if not page.sections:
        raise ReportError("nothing to report: no bench results and no winners or studies in the database")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sources = [r.path for r in runs] + ([db.display_url] if db is not None else [])
    note_html = "".join(f"<li>{_esc(n)}</li>" for n in page.notes)
    text = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><title>autotaxer report</title>',
            f"<style>{_STYLE}</style></head><body>",
            "<h1>autotaxer report</h1>",
            f"<p>generated {now} from {_esc(', '.join(sources))}. Times in ms per call (faster of eager "
            "and CUDA graph), speedups over the fastest BSP form; the ceiling is BSP / max(all-gather alone, "
            "GEMM alone).</p>",
            f"<ul>{note_html}</ul>" if note_html else "",
            *page.sections,
            "</body></html>",
        ]
    )
    return text, page.figures, page.notes


def _write_atomic(path: Path, data: bytes) -> None:
    from .output_file import write_atomic

    write_atomic(path, data, what="the report's file")


def write_report(
    out_dir: str | os.PathLike[str],
    results: Iterable[str | os.PathLike[str]] = (),
    db_url: str | None = None,
) -> ReportResult:
    """Build the report of ``results`` (files or folders) and the database at ``db_url`` into ``out_dir``.

    Everything is rendered in memory first; files are then written one by one through a temporary
    name, the page (``index.html``) last, so an error leaves no half-written file.
    """
    runs, notes = load_bench_results(results)
    from .storage import MissingDatabase, open_database

    try:
        if db_url is None:
            raise MissingDatabase("no database given")
        with open_database(db_url, read_only=True) as db:
            text, figures, notes = build_page(runs, db, notes)
    except MissingDatabase:  # nothing tuned there: the bench results alone
        text, figures, notes = build_page(runs, None, notes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = []
    for f in figures:
        _write_atomic(out / f.name, f.png)
        pngs.append(out / f.name)
    page = out / "index.html"
    _write_atomic(page, text.encode("utf-8"))
    return ReportResult(page, tuple(pngs), tuple(notes))
