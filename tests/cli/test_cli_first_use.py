"""What a user meets first: ``tune`` refuses a world size the visible GPUs cannot hold, warns before a
long CPU run, shows progress outside a terminal; ``show`` and the tune summary fit 80 columns; flags
read as flags in ``--help``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from _factories import make_record
from typer.testing import CliRunner

from autotaxer.cli import app
from autotaxer.storage import open_database

ROOT = Path(__file__).resolve().parents[2]


def test_fewer_gpus_than_the_world_size_is_refused_unless_cpu_is_asked(tmp_path, monkeypatch) -> None:
    import autotaxer._target

    monkeypatch.setattr(autotaxer._target, "visible_gpus", lambda: 1)
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K\n64,8,8\n")
    db = tmp_path / "t.sqlite"
    args = ["tune", "--world-size", "2", "--shapes", str(shapes), "--db", f"sqlite:///{db}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--world-size 2 needs 2 GPUs, 1 visible" in result.output and "--device cpu" in result.output
    assert "Traceback" not in result.output and not db.exists()


def test_show_fits_80_columns_and_wide_shows_every_field(tmp_path) -> None:
    from autotaxer import ProblemKey

    url = f"sqlite:///{tmp_path}/t.sqlite"
    nk = make_record(16384, median_us=2222.2, bsp_us=3333.3, variant="copy_engine")
    nk = type(nk)(**{**nk.__dict__, "key": ProblemKey.make(
        "ag_gemm", "nvidia-h200", 8, "bf16", {"M": 16384, "N": 28672, "K": 8192},
        {"gather_dim": 1, "b_layout": "nk"})})  # fmt: skip
    with open_database(url) as db:
        db.upsert_winners([make_record(16, median_us=20.0, bsp_us=30.0, confirmed=True), nk])
    runner = CliRunner(env={"COLUMNS": "80", "AUTOTAXER_DB": None})
    result = runner.invoke(app, ["show", "--db", url])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output and max(map(len, lines)) <= 80, result.output
    assert any("M=16384 N=28672 K=8192 gd=1 nk" in line and "copy_engine" in line for line in lines)
    assert any("M=16 N=8192 K=8192 gd=0" in line and "1.50×" in line for line in lines)
    # nk's record was never confirmed (times of its best trial against one BSP sample): no speedup shown
    assert not any("copy_engine" in line and "×" in line for line in lines)
    assert any(line.startswith("- : speedup not confirmed") for line in lines)
    wide = CliRunner(env={"COLUMNS": "250", "AUTOTAXER_DB": None}).invoke(
        app, ["show", "--db", url, "--wide"]
    )
    assert "gather_dim=1,b_layout=nk" in wide.output and "BLOCK_M=128" in wide.output
    narrow = runner.invoke(app, ["show", "--db", url, "--wide"])  # 80 columns: one record a block, none cut
    lines = narrow.output.splitlines()
    assert narrow.exit_code == 0 and "…" not in narrow.output and max(map(len, lines)) <= 80, narrow.output
    assert "gather_dim=1,b_layout=nk" in narrow.output and "BLOCK_M=128" in narrow.output
    assert any(line.split() == ["median", "µs", "2222.2"] for line in lines), narrow.output


def test_tune_summary_fits_80_columns() -> None:
    from rich.console import Console

    from autotaxer.tuner.progress import ShapeResult, summary_table

    text = "ag_gemm|nvidia-h200|8|bf16|M=16384,N=28672,K=8192|gather_dim=1,b_layout=nk"
    params = {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8, "comm_sms": 16}
    result = ShapeResult(
        text, "copy_engine", params, 2222.2, 3333.3, 40, 1, 0, 40, 12.0, True, confirmed=True
    )
    out = io.StringIO()
    Console(file=out, width=80).print(summary_table([result]))
    assert "…" not in out.getvalue() and "1.50×" in out.getvalue() and "nk" in out.getvalue()
    wide = io.StringIO()
    Console(file=wide, width=250).print(summary_table([result], wide=True))
    assert '"comm_sms": 16' in wide.getvalue()


def _commands() -> list[list[str]]:
    """Every command path of the CLI: ``[]`` (the root), ``["tune"]``, ``["db", "upgrade"]``, ..."""
    import typer

    paths, todo = [], [([], typer.main.get_command(app))]
    while todo:
        path, command = todo.pop()
        paths.append(path)
        todo += [([*path, name], sub) for name, sub in getattr(command, "commands", {}).items()]
    return sorted(paths)


def test_every_help_screen_reads_well_at_80_columns() -> None:
    """No type placeholder on a flag (``<bool>``), no reST backticks, no Python type names, nothing cut
    (``…``), every line within 80 columns, and every option named in full."""
    import typer

    root = typer.main.get_command(app)
    for path in _commands():
        result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        text = result.output
        for bad in ("<bool>", "`", "…", "<list[", "Path]"):
            assert bad not in text, (path, bad, text)
        assert max(map(len, text.splitlines())) <= 80, (path, text)
        command = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    assert re.search(rf"{re.escape(opt)}\b", text), (path, opt, text)


def test_flags_read_as_flags_in_help() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["tune", "--help"])
    for flag in ("--retune", "--quiet", "--jsonl", "--wide", "--yes"):
        (line,) = [line for line in result.output.splitlines() if re.match(rf"\s*(-\w, )?{flag} ", line)]
        assert "<" not in line, line


def test_a_long_cpu_run_is_announced_and_a_short_one_is_not() -> None:
    from autotaxer.cli._estimate import tune_verdict
    from autotaxer.shapes import load_shapes

    def keys(name: str) -> list:
        return [row.to_key("cpu", 2) for row in load_shapes(ROOT / "examples" / name)]

    level, message = tune_verdict(keys("shapes_llm.csv"), 16, 2, yes=True)
    assert level == "warn" and "for these 18 shape(s) x 16 trials" in message and "shapes_cpu.csv" in message
    assert tune_verdict(keys("shapes_llm.csv"), 16, 2, yes=False)[0] == "refuse"
    assert tune_verdict(keys("shapes_cpu.csv"), 8, 2, yes=False) is None


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_a_gpu_sized_run_on_a_cpu_is_refused_unless_yes(tmp_path, command: str) -> None:
    """The README's GPU lines on a CPU: refused at once with the estimate, the way out and the CPU
    example, nothing written; ``--yes`` is what the refusal names."""
    db = tmp_path / "t.sqlite"
    args = [
        command,
        "--world-size",
        "2",
        "--shapes",
        str(ROOT / "examples" / "shapes_llm.csv"),
        "--device",
        "cpu",
    ]
    args += ["--db", f"sqlite:///{db}"] + (
        ["--trials", "16"] if command == "tune" else ["--out", str(tmp_path / "b.json")]
    )
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "the CPU pipeline needs about" in result.output and "not started (pass --yes" in result.output
    assert "examples/shapes_cpu.csv" in result.output and "Traceback" not in result.output
    assert not db.exists() and not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_progress_outside_a_terminal_is_printed_line_by_line(monkeypatch, tty: bool) -> None:
    """A pipe or a log gets a line per trial, each within 80 columns (keys in their short form)."""
    import sys

    from autotaxer.cli.tune import _reporter
    from autotaxer.tuner.progress import PlainReporter, RichReporter, ShapeResult, Summary, TrialEvent

    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    reporter = _reporter(False, False, False)
    reporter.close()
    assert isinstance(reporter, RichReporter if tty else PlainReporter)
    out = io.StringIO()
    plain = PlainReporter(out, trials=True)
    plain.shape_start(1, 3, "ag_gemm|cpu|2|fp32|M=8,N=8,K=8|gather_dim=0", 8, 2)
    plain.trial(TrialEvent(1, 3, "k", 3, 8, 5, "bsp", {}, "COMPLETE", 12.5, 0.0, None, 12.5, 12.5))
    key = "ag_gemm|nvidia-h200|8|bf16|M=16384,N=28672,K=8192|gather_dim=1,b_layout=nk"
    plain.shape_done(3, 3, ShapeResult(key, "copy_engine", {}, 2222.2, 3333.3, 40, 1, 0, 40, 12.0, True))
    plain.note("--device auto: no GPU visible, running the CPU pipeline (records are stored for gpu_model "
               "'cpu' and never served to GPUs)")  # fmt: skip
    plain.finish([], Summary(3, 24, 9.3, 1, 3.4, 103.0, 102.0, 244.0))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/3] ag_gemm fp32 M=8 N=8 K=8 gd=0: 2 of 8 trials done"
    assert lines[1].startswith("  trial 3/8 bsp 12.5 µs; best 12.5 µs, bsp 12.5 µs")  # no unconfirmed ratio
    assert lines[2] == "[3/3] ag_gemm bf16 M=16384 N=28672 K=8192 gd=1 nk: copy_engine 2,222.2 µs"
    assert max(map(len, lines)) <= 80, lines


def test_no_option_help_is_swallowed_as_rich_markup() -> None:
    """Typer renders help through rich, which takes ``[...]`` as markup and drops it: a help text such as
    "the database [default: ...]" would print as "the database ." (it did, for --db and --file-format)."""
    import re

    import typer

    from autotaxer.cli import app

    group = typer.main.get_command(app)
    swallowed = [
        f"{name} {param.name}: {param.help}"
        for name, command in group.commands.items()
        for param in command.params
        if getattr(param, "help", None) and re.search(r"\[[a-z][^\]]*\]", param.help)
    ]
    assert swallowed == []


@pytest.mark.parametrize(
    "command, option, value",
    [("tune", "--device", "xpu"), ("bench", "--device", "gpu"), ("tune", "--timing", "cuda-graph"),
     ("tune", "--sampler", "cmaes"), ("bench", "--dispatch-timing", "Graph"), ("tune", "--chain", "b2b"),
     ("bench", "--chain", "independent")],
)  # fmt: skip
def test_a_value_outside_an_options_choices_is_a_usage_error_naming_it(
    tmp_path, command: str, option: str, value: str
) -> None:
    """Every ``<a|b|c>`` option is checked before the command runs: exit 2, the option and its choices
    named, no traceback, nothing written."""
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,dtype\n64,64,64,fp32\n")
    db = tmp_path / "t.sqlite"
    args = [command, "--world-size", "1", "--shapes", str(shapes), "--db", f"sqlite:///{db}", option, value]
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, args)
    assert result.exit_code == 2, result.output
    out = result.output
    assert f"'{option}'" in out and "expected one of" in out and repr(value) in out
    assert "Traceback" not in result.output
    assert not db.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["shapes.csv"]


def test_show_marks_replayed_winners_timed_before_replays(tmp_path) -> None:
    """``copy_engine`` is served as CUDA-graph replays; a record of it timed eagerly, every launch from
    Python (no ``env["launch"]``: every shipped one before 2026-11-27), understates it and is marked ``†``
    with a legend; one timed as replays, a graph-timed one and another variant are not."""
    import dataclasses

    url = f"sqlite:///{tmp_path}/t.sqlite"

    def rec(m: int, variant: str, **env):
        r = make_record(m, variant=variant, confirmed=True)
        return dataclasses.replace(r, env={**r.env, **env})

    records = [rec(16, "copy_engine"), rec(32, "copy_engine", launch="replay"),
               rec(64, "copy_engine", timing="graph"), rec(128, "push")]  # fmt: skip
    with open_database(url) as db:
        db.upsert_winners(records)
    runner = CliRunner(env={"COLUMNS": "200", "AUTOTAXER_DB": None})
    for args in ([], ["--wide"]):
        result = runner.invoke(app, ["show", "--db", url, *args])
        assert result.exit_code == 0, result.output
        assert result.output.count("copy_engine†") == 1, result.output  # the eagerly timed record only
        assert result.output.count("†") == 2  # it and the legend
        assert "† timed before CUDA-graph replays" in result.output
    compact = runner.invoke(app, ["show", "--db", url]).output.splitlines()
    assert any("copy_engine†" in line and "M=16 " in line for line in compact), compact
