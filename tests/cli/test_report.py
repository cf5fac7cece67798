"""``autotaxer report``: HTML + PNGs from stored bench results and a database of winners and studies."""

from __future__ import annotations

import base64
import re
import shutil
from pathlib import Path

import pytest
from _factories import make_key, make_record
from typer.testing import CliRunner

from autotaxer.cli import app
from autotaxer.report import MIN_TRIALS_FOR_IMPORTANCE, ReportError, load_bench_file, write_report
from autotaxer.storage import open_database

#: Two stored bench runs (2xH200, 2026-11-21; bench/results/2026-11-21_ag_gemm_quick_h200x2/).
DATA = Path(__file__).resolve().parent / "data"
STORED = [DATA / "ag_gemm_quick_h200x2_run1.json", DATA / "ag_gemm_quick_h200x2_allconfigs.json"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "200"})


def _add_study(db, key, values, variants=("bsp", "cpu_chunked")):
    """A study named like the tuner's, with COMPLETE trials in its flat parameter form."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=key.text, storage=db.optuna_storage(), direction="minimize")
    for i, value in enumerate(values):
        variant = variants[i % len(variants)]
        params = {"variant": variant}
        dists = {"variant": CategoricalDistribution(list(variants))}
        if variant == "cpu_chunked":
            params["cpu_chunked.chunks"] = (1, 2, 4)[i % 3]
            dists["cpu_chunked.chunks"] = CategoricalDistribution([1, 2, 4])
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    return study


@pytest.fixture
def db_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    with open_database(url) as db:
        db.upsert_winners(
            [
                make_record(64, median_us=10.0, bsp_us=15.0, variant="push"),
                make_record(1024, median_us=90.0, bsp_us=100.0, variant="copy_engine"),
                make_record(256, median_us=50.0, bsp_us=60.0, variant="pull", gather_dim=1),
            ]
        )
        _add_study(db, make_key(64), [30.0, 20.0, 25.0, 15.0, 12.0, 18.0, 11.0])  # enough for importances
        _add_study(db, make_key(1024), [100.0, 90.0])  # too few: importances guarded
    return url


def _pngs_valid(paths):
    import matplotlib.image as mpimg

    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC), p
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50, p


def test_report_from_stored_results_and_database(tmp_path, db_url):
    out = tmp_path / "report"
    result = write_report(out, STORED, db_url)
    html = result.html_path.read_text()
    # Bench sections: 2 files x (2 layouts' speedup plots + 1 winner map).
    # Database: winners of nvidia-h200 x2 in 2 (N, K, layout) groups + 1 winner map.
    # Studies: history for both, importances only for the one with enough trials.
    assert len(result.png_paths) == 2 * 3 + (2 + 1) + (2 + 1)
    assert sorted(p.name for p in out.glob("*.png")) == sorted(p.name for p in result.png_paths)
    _pngs_valid(result.png_paths)
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(result.png_paths)
    assert all(base64.b64decode(e).startswith(PNG_MAGIC) for e in embedded)
    assert sum(p.name.endswith("_importance.png") for p in result.png_paths) == 1
    for text in ("NVIDIA H200", "copy_engine", "torch_fused", "iris_stock", "N=8192 K=8192 gd=0", "gd=1"):
        assert text in html, text
    for rec_variant in ("push", "pull"):
        assert f"<td>{rec_variant}</td>" in html
    assert make_key(64).text in html and make_key(1024).text in html
    assert "ceiling" in html and "2.11.0+cu130" in html  # versions of the stored run
    assert any(f"at least {MIN_TRIALS_FOR_IMPORTANCE} needed" in n for n in result.notes)
    assert not list(out.glob("*.tmp"))


def test_report_cli_says_what_it_skipped_in_notes_not_library_warnings(tmp_path, db_url):
    """Optuna warns that an importance estimate rests on few trials per parameter value: the report
    says so in one wrapped note, not as a warning with a site-packages path."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    variant = CategoricalDistribution(["bsp", "cpu_chunked"])
    chunks = CategoricalDistribution([1, 2, 4, 8, 16, 32])
    with open_database(db_url) as db:  # every chunk count tried once: Optuna warns
        study = optuna.create_study(study_name=make_key(4096).text, storage=db.optuna_storage())
        bsp = optuna.trial.create_trial(
            params={"variant": "bsp"}, distributions={"variant": variant}, value=20.0
        )
        study.add_trial(bsp)
        for i, c in enumerate(chunks.choices):
            params = {"variant": "cpu_chunked", "cpu_chunked.chunks": c}
            dists = {"variant": variant, "cpu_chunked.chunks": chunks}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=10.0 + i))
    result = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "80"}).invoke(
        app, ["report", "--db", db_url, "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output and "site-packages" not in result.output, result.output
    assert "may be inaccurate" in result.output
    notes = [line for line in result.output.splitlines() if not line.startswith("wrote ")]
    assert notes and all(len(line) <= 80 for line in notes), notes


def test_report_cli_folder_skips_other_formats(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for f in STORED:
        shutil.copy(f, results / f.name)
    (results / "overhead.json").write_text('{"p50_us": 1.5}')  # another format: skipped with a note
    out = tmp_path / "r"
    res = runner.invoke(app, ["report", str(results), "--no-db", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "skipped" in res.output and (out / "index.html").is_file()
    assert len(list(out.glob("*.png"))) >= 6


def test_bad_results_file_is_a_clear_error_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": [{"M": 16, "N": 8192, "K": "x", "gather_dim": 0}]}')
    with pytest.raises(ReportError, match=r"bad\.json: rows\[0\]: field 'K'"):
        load_bench_file(bad)
    out = tmp_path / "r"
    res = runner.invoke(app, ["report", str(bad), "--no-db", "--out", str(out)])
    assert res.exit_code == 2
    assert "bad.json" in res.output and "'K'" in res.output
    assert not out.exists()
    (tmp_path / "broken.json").write_text("{not json")
    res = runner.invoke(app, ["report", str(tmp_path / "broken.json"), "--no-db", "--out", str(out)])
    assert res.exit_code == 2 and "not valid JSON" in res.output


def test_nothing_to_report(tmp_path):
    res = runner.invoke(
        app, ["report", "--db", f"sqlite:///{tmp_path / 'empty.db'}", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 2 and "nothing to report" in res.output


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ReportError, match=r"autotaxer\[report\]"):
        write_report(tmp_path / "r", STORED[:1], None)
    assert not (tmp_path / "r").exists()


def test_the_ceiling_the_legend_names_is_drawn_at_a_single_m() -> None:
    """A group of one M (every CPU shape) has a one-point ceiling: it is drawn (a marker), not only
    named in the legend."""
    pytest.importorskip("matplotlib")
    from autotaxer.report import _speedup_figure

    fig = _speedup_figure("cpu ×2, N=256 K=256", {"cpu_chunked": [(64, 1.2)]}, [(64, 2.0)])
    (ceiling,) = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("ceiling")]
    assert ceiling.get_marker() not in (None, "None", "", " ") and list(ceiling.get_ydata()) == [2.0]
