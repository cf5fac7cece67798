"""``autotaxer bench --device cpu``: the side-by-side benchmark end to end on gloo ranks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autotaxer.benchmark.case import BenchConfig, Case
from autotaxer.benchmark.rows import best_us, ceiling_us, fastest_entry, progress_line, row_entries, row_line
from autotaxer.benchmark.tuned import tuned_params
from autotaxer.cli import app
from autotaxer.storage import open_database

runner = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "200", "AUTOTAXER_TABLE": None})
SHAPES = "op,M,N,K,dtype,gather_dim\nag_gemm,64,64,64,fp32,0\nag_gemm,32,64,64,fp32,1\n"
TUNED = {"chunks": 2, "order": "rotated"}


def _tune_case(url: str, case: Case) -> None:
    """A study like the tuner's for ``case`` whose best cpu_chunked trial is :data:`TUNED`."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open_database(url) as db:
        key = case.key("cpu", 2)
        study = optuna.create_study(study_name=key.text, storage=db.optuna_storage())
        dists = {
            "variant": CategoricalDistribution(["bsp", "cpu_chunked"]),
            "cpu_chunked.chunks": CategoricalDistribution([1, 2, 4, 8]),
            "cpu_chunked.order": CategoricalDistribution(["ascending", "rotated"]),
        }
        for chunks, order, value in ((1, "ascending", 50.0), (2, "rotated", 20.0), (4, "rotated", 30.0)):
            params = {"variant": "cpu_chunked", "cpu_chunked.chunks": chunks, "cpu_chunked.order": order}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
        bsp = {"variant": "bsp"}
        study.add_trial(
            optuna.trial.create_trial(params=bsp, distributions={"variant": dists["variant"]}, value=40.0)
        )


def test_tuned_params_reads_each_variants_best_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cases = (
        Case.of("ag_gemm", "fp32", M=64, N=64, K=64, gather_dim=0),
        Case.of("ag_gemm", "fp32", M=32, N=64, K=64, gather_dim=1),
    )
    _tune_case(url, cases[0])
    with open_database(url) as db:
        tuned = tuned_params(db, cases, "cpu", 2)
    assert tuned == {0: {"cpu_chunked": TUNED, "bsp": {}}}


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="cases"):
        BenchConfig(cases=()).validate()
    with pytest.raises(ValueError, match="device"):
        BenchConfig(cases=(Case.of("ag_gemm", M=8, N=8, K=8),), device="tpu").validate()
    with pytest.raises(ValueError, match="max_configs"):
        BenchConfig(cases=(Case.of("ag_gemm", M=8, N=8, K=8),), max_configs=0).validate()
    with pytest.raises(ValueError, match="dispatch_timing"):
        BenchConfig(cases=(Case.of("ag_gemm", M=8, N=8, K=8),), dispatch_timing="replay").validate()
    with pytest.raises(ValueError, match="^chain:"):
        BenchConfig(cases=(Case.of("ag_gemm", M=8, N=8, K=8),), chain="b2b").validate()


@pytest.mark.slow
def test_bench_cli_cpu_world_size_2(tmp_path):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text(SHAPES)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    _tune_case(url, Case.of("ag_gemm", "fp32", M=64, N=64, K=64, gather_dim=0))
    out = tmp_path / "res" / "bench.json"
    args = ["bench", "--device", "cpu", "--world-size", "2", "--shapes", str(shapes), "--db", url]
    timing = ["--iters", "2", "--samples", "3", "--dispatch-timing", "eager"]
    res = runner.invoke(app, [*args, "--out", str(out), "--max-configs", "2", *timing])
    assert res.exit_code == 0, res.output
    assert "cpu_chunked" in res.output and "dispatch" in res.output and f"wrote {out}" in res.output
    report = json.loads(out.read_text())
    for field in ("device", "versions", "date", "command", "config", "units", "world_size"):
        assert report[field], field
    assert report["device"] == "cpu" and report["world_size"] == 2
    config = report["config"]
    assert (config["iters"], config["samples"], config["dispatch_timing"]) == (2, 3, "eager")
    assert config["chain"] == "dependent"  # each call waits for the previous one's output, as in the tuner
    assert report["versions"]["torch"] and report["versions"]["autotaxer"]
    rows = report["rows"]
    assert [(r["M"], r["gather_dim"]) for r in rows] == [(64, 0), (32, 1)]
    # each row was also appended as it finished, so a run cut short keeps its rows
    progress = [
        json.loads(line) for line in (tmp_path / "res" / "bench.json.rows.jsonl").read_text().splitlines()
    ]
    assert [(r["M"], r["gather_dim"]) for r in progress] == [(64, 0), (32, 1)]
    for row in rows:
        assert "error" not in row
        for column in ("bsp", "allgather", "gemm"):
            assert row[column]["eager"] > 0, column
            assert "graph" not in row[column]  # CPU: eager only
        assert row["bsp"]["eager_link"] > 0 and "eager_link" not in row["gemm"]  # the parts: back to back
        assert ceiling_us(row) > 0
        chunked = row["variants"]["cpu_chunked"]
        assert chunked["eager"] > 0 and chunked["err"] <= 1e-3
        disp = row["dispatch"]
        assert disp["eager"] > 0 and disp["err"] <= 1e-3 and disp["variant"] in ("bsp", "cpu_chunked")
        peer = "torch_fused" if row["gather_dim"] == 0 else "iris_stock"
        assert row[peer] == {"skipped": "needs CUDA"}
        assert all(
            best_us(e) > 0 for n, e in row_entries(row).items() if n not in ("torch_fused", "iris_stock")
        )
    # The tuned case runs cpu_chunked at its best trial; the other one sweeps (capped at 2 configs).
    assert rows[0]["variants"]["cpu_chunked"]["source"] == "tuned"
    assert rows[0]["variants"]["cpu_chunked"]["best_params"] == TUNED
    assert rows[1]["variants"]["cpu_chunked"]["source"] == "sweep"
    assert len(rows[1]["variants"]["cpu_chunked"]["tried"]) == 2


def test_bench_cli_bad_input_writes_nothing(tmp_path):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("op,M,N,K\nag_gemm,63,64,64\n")  # M not divisible by 2 ranks
    out = tmp_path / "bench.json"
    base = ["bench", "--device", "cpu", "--world-size", "2", "--out", str(out)]
    res = runner.invoke(app, [*base, "--shapes", str(shapes), "--db", f"sqlite:///{tmp_path / 'db'}"])
    assert res.exit_code == 2 and "shapes.csv:2" in res.output and "'M'" in res.output
    shapes.write_text(SHAPES)
    res = runner.invoke(app, [*base, "--shapes", str(shapes), "--variants", "nope"])
    assert res.exit_code == 2 and "nope" in res.output
    res = runner.invoke(app, [*base, "--shapes", str(shapes), "--device", "tpu"])
    assert res.exit_code == 2 and "--device" in res.output
    res = runner.invoke(app, [*base, "--shapes", str(shapes), "--dispatch-timing", "replay"])
    assert res.exit_code == 2 and "--dispatch-timing" in res.output and "replay" in res.output
    assert not out.exists()


def _mixed_row() -> dict:
    """A row with an untimed variant (no valid configuration), a failed one and a timed one."""
    return {
        "N": 8192, "K": 8192, "gather_dim": 0, "M": 8,
        "bsp": {"eager": 60.0, "graph": 40.0}, "allgather": {"eager": 12.0}, "gemm": {"graph": 30.0},
        "variants": {
            "push_tma": {"valid_configs": 0, "tried": []},
            "pull": {"valid_configs": 3, "tried": [], "failed": ["rel err"]},
            "push": {"valid_configs": 3, "eager": 50.0, "graph": 32.0},
        },
    }  # fmt: skip


def test_row_line_tells_no_valid_config_from_failure():
    """A variant with no valid configuration at the shape reads "n/a"; one whose configurations all
    failed reads "FAIL"; a timed one its speedup over the faster BSP."""
    line = row_line(_mixed_row())
    assert "push_tma: n/a" in line and "pull: FAIL" in line
    assert "push: 0.050/0.032 ×1.25" in line and "ceiling ×1.33" in line


def test_table_tells_no_valid_config_from_failure(capsys, monkeypatch):
    """The printed table says what the row line says: "n/a" where no configuration is valid (a
    copy-engine variant at one rank), "fail" only where the tried configurations failed."""
    from autotaxer.cli.bench import _print_table

    monkeypatch.setenv("COLUMNS", "200")
    _print_table({"device": "cpu", "world_size": 2, "rows": [_mixed_row()]})
    cells = [c.strip() for line in capsys.readouterr().out.splitlines() for c in line.split("│")]
    assert "n/a" in cells and "FAIL" in cells and "0.032 ×1.25" in cells


def test_table_fits_80_columns(capsys, monkeypatch):
    """At 80 columns a row is one line: BSP, the fastest variant or peer with its speedup, dispatch's
    speedup and the ceiling's (the full table needs ~120 columns for a CPU run, more on GPUs)."""
    from autotaxer.cli.bench import _print_table

    monkeypatch.setenv("COLUMNS", "80")
    rows = [_mixed_row(), {**_mixed_row(), "M": 16384, "N": 28672, "dispatch": {"eager": 48.0}}]
    _print_table({"device": "NVIDIA H200", "world_size": 8, "rows": rows})
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines), lines
    (line,) = [line for line in lines if "16384x28672x8192 gd=0" in line]
    assert line.split()[2:] == ["0.040", "push", "×1.25", "×0.83", "×1.33"]


def test_the_fastest_is_never_slower_than_bsp_and_dispatch_names_what_it_served():
    """A row whose only variant is slower than BSP reads "fastest bsp ×1.00", never a variant below ×1;
    dispatch's speedup names the form it served (the same form's column is in the same interleaved run)."""
    row = {
        "M": 64, "N": 256, "K": 256, "gather_dim": 0, "bsp": {"eager": 1776.0},
        "variants": {"cpu_chunked": {"valid_configs": 4, "eager": 2900.0}},
        "dispatch": {"variant": "bsp", "eager": 1800.0},
    }  # fmt: skip
    assert fastest_entry(row) == ("bsp", 1776.0)
    assert progress_line(row) == "BSP 1.776 ms | fastest bsp ×1.00 | dispatch (bsp) ×0.99"
    faster = {**row, "variants": {"cpu_chunked": {"valid_configs": 4, "eager": 888.0}}}
    assert fastest_entry(faster) == ("cpu_chunked", 888.0)


def _store_cpu_winner(url: str, case: Case, variant: str, params: dict) -> None:
    """A winner for ``case`` at 2 CPU ranks in the database at ``url``, as ``tune`` stores one."""
    from autotaxer.records import WinnerRecord
    from autotaxer.runtime.kernel_hash import kernel_source_hash

    record = WinnerRecord(
        key=case.key("cpu", 2), variant=variant, params=params, median_us=10.0, bsp_us=20.0, trials=8,
        kernel_hash=kernel_source_hash(case.op, variant), device_type="cpu",
    )  # fmt: skip
    with open_database(url) as db:
        db.upsert_winners([record])


def test_bench_runs_gemm_rs_rows_beside_ag_gemm(tmp_path):
    """A shapes file with both ops: the gemm_rs rows time BSP, the reduce-scatter alone and the local
    GEMM alone (the ceiling), dispatch, and report the speedups against the fastest BSP form. Without
    ``--db`` both the variants' configurations and dispatch come from the default database (the one
    ``tune`` wrote): a winner stored there is dispatch's choice, not a fallback to BSP."""
    from autotaxer.benchmark.rows import bsp_us, comm_entry

    shapes = tmp_path / "shapes.csv"
    shapes.write_text(
        "op,M,N,K,dtype,gather_dim,scatter_dim\n"
        "ag_gemm,32,64,64,fp32,0,\ngemm_rs,32,64,64,fp32,,0\ngemm_rs,32,64,64,fp32,,1\n"
    )
    data = tmp_path / "data"  # the default database: $XDG_DATA_HOME/autotaxer/tuning.sqlite
    (data / "autotaxer").mkdir(parents=True)
    _store_cpu_winner(
        f"sqlite:///{data}/autotaxer/tuning.sqlite",
        Case.of("ag_gemm", "fp32", M=32, N=64, K=64, gather_dim=0),
        "cpu_chunked",
        TUNED,
    )
    out = tmp_path / "bench.json"
    args = ["bench", "--device", "cpu", "--world-size", "2", "--shapes", str(shapes), "--out", str(out)]
    env = {"AUTOTAXER_DB": None, "XDG_DATA_HOME": str(data), "COLUMNS": "80", "AUTOTAXER_TABLE": None}
    default_db = CliRunner(env=env)
    res = default_db.invoke(app, [*args, "--iters", "2", "--samples", "3"])
    assert res.exit_code == 0, res.output
    assert "gemm_rs" in res.output
    rows = json.loads(out.read_text())["rows"]
    dims = [(r["op"], r.get("gather_dim", r.get("scatter_dim"))) for r in rows]
    assert dims == [("ag_gemm", 0), ("gemm_rs", 0), ("gemm_rs", 1)]
    assert "gather_dim" not in rows[1] and rows[1]["parts"] == ["reduce_scatter", "gemm"]
    tuned = rows[0]["variants"]["cpu_chunked"]
    assert (tuned["source"], tuned["best_params"]) == ("tuned", TUNED)
    assert (rows[0]["dispatch"]["variant"], rows[0]["dispatch"]["source"]) == ("cpu_chunked", "exact")
    for row in rows[1:]:
        assert "error" not in row, row
        assert "allgather" not in row and row["reduce_scatter"]["eager"] > 0
        assert comm_entry(row) is row["reduce_scatter"] and ceiling_us(row) > 0
        assert row["bsp"]["eager"] > 0 and bsp_us(row) == best_us(row["bsp"])  # one BSP form on CPU
        disp = row["dispatch"]
        assert disp["variant"] == "bsp" and disp["err"] <= 1e-3 and disp["eager"] > 0
        assert "iris_stock" not in row  # Iris ships no reduce-scatter + GEMM
        if row["scatter_dim"] == 0:  # torch's fused_matmul_reduce_scatter: scatter dim 0, on GPUs
            assert row["torch_fused"] == {"skipped": "needs CUDA"}
