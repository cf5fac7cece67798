"""Faults at the wrong moment: tuners starting at once on a new database (and after ``db upgrade``),
queued trials taken by racing tuners, and many random kills across a whole tuning run."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

AUTOTAXER = str(Path(sys.executable).with_name("autotaxer"))


def _open_and_queue(url: str, start_at: float, n: int, out) -> None:
    """Open the database and Optuna's storage at ``start_at``, then take ``n`` queued trials."""
    from autotaxer._problem import ProblemKey
    from autotaxer.storage import open_database
    from autotaxer.tuner.study import ask_owned, open_study

    try:
        time.sleep(max(0.0, start_at - time.time()))
        db = open_database(url)
        study = open_study(
            db.optuna_storage(), ProblemKey.from_text("ag_gemm|cpu|1|fp32|M=8,N=8,K=8|gather_dim=0"), None
        )
        taken = []
        for _ in range(n):
            trial = ask_owned(study, f"test:{os.getpid()}")
            taken.append(trial.number)
            study.tell(trial, 1.0)
        db.close()
        out.put(("ok", taken))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put(("error", f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("upgraded", [False, True], ids=["fresh-file", "after-db-upgrade"])
def test_processes_opening_a_new_database_at_once_all_succeed(tmp_path, upgraded: bool) -> None:
    from typer.testing import CliRunner

    from autotaxer.cli import app

    url = f"sqlite:///{tmp_path}/new.sqlite"
    if upgraded:
        assert CliRunner().invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
        con = sqlite3.connect(tmp_path / "new.sqlite")
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        con.close()
        assert {"studies", "trials", "alembic_version", "autotaxer_winners"} <= tables  # both schemas
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 4.0
    procs = [ctx.Process(target=_open_and_queue, args=(url, start_at, 3, out)) for _ in range(8)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    errors = [r for status, r in results if status != "ok"]
    assert not errors, errors
    numbers = [n for _, taken in results for n in taken]
    assert len(numbers) == len(set(numbers)) == 24  # no trial was taken twice


@pytest.mark.slow
@pytest.mark.parametrize("upgraded", [False, True], ids=["fresh-file", "after-db-upgrade"])
def test_tuners_started_at_once_store_one_winner_per_shape(tmp_path, upgraded: bool) -> None:
    """Six ``autotaxer tune`` processes on one new SQLite file, started together."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K,dtype\n8,8,8,fp32\n16,8,8,fp32\n")
    if upgraded:
        subprocess.run([AUTOTAXER, "db", "upgrade", "--db", url], check=True, capture_output=True)
    cmd = [AUTOTAXER, "tune", "--device", "cpu", "--world-size", "1", "--shapes", str(shapes), "--db", url]
    cmd += ["--trials", "4", "--quiet"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    failed = [(p.returncode, err[-2000:]) for p, (_, err) in zip(procs, outs, strict=True) if p.returncode]
    assert not failed, failed
    assert all("Traceback" not in err for _, err in outs)
    from autotaxer.storage import open_database

    with open_database(url) as db:
        winners = db.winners()
    assert sorted(w.key["M"] for w in winners) == [8, 16]
    con = sqlite3.connect(tmp_path / "t.sqlite")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    running = con.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]
    con.close()
    assert running == 0


@pytest.mark.slow
def test_random_kills_across_a_whole_run_lose_nothing(tmp_path) -> None:
    """SIGKILL the tuner at 30+ random moments (after 0.3 to 3 s: set-up, schema creation, a trial,
    a commit) and resume each time; the final table equals an uninterrupted run's coverage: every
    shape has its winner, every shape its finished trials, no trial left RUNNING, the file intact."""
    import optuna

    from autotaxer._problem import ProblemKey
    from autotaxer.storage import open_database

    rows = "M,N,K,dtype,gather_dim\n8,8,8,fp32,0\n16,8,16,fp32,1\n"
    shapes = tmp_path / "s.csv"
    shapes.write_text(rows)
    url = f"sqlite:///{tmp_path}/k.sqlite"
    cmd = [AUTOTAXER, "tune", "--device", "cpu", "--world-size", "2", "--shapes", str(shapes), "--db", url]
    cmd += ["--trials", "6", "--quiet", "--seed", "3"]
    rng = random.Random(7)
    kills = 0
    for _ in range(60):
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            proc.wait(timeout=rng.uniform(0.3, 3.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its workers, as a kill of the job would
            proc.wait(timeout=30)
            kills += 1
            if kills >= 32:
                break
            continue
        if proc.returncode == 0 and kills >= 30:
            break
    assert kills >= 30
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    keys = [
        ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": 8, "N": 8, "K": 8}, {"gather_dim": 0}),
        ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": 16, "N": 8, "K": 16}, {"gather_dim": 1}),
    ]
    with open_database(url) as db:
        winners = {w.key: w for w in db.winners()}
        storage = db.optuna_storage()
        for key in keys:
            trials = optuna.load_study(study_name=key.text, storage=storage).get_trials()
            ended = [
                t
                for t in trials
                if t.state.name == "COMPLETE"
                or (t.state.name == "FAIL" and not t.user_attrs.get("interrupted"))
            ]
            assert len(ended) == 6, (key.text, [(t.state.name, t.user_attrs.get("failure")) for t in trials])
            assert all(t.state.name == "COMPLETE" for t in ended)  # nothing failed on its own
            assert not [t for t in trials if t.state.name == "RUNNING"]
            assert any(t.params.get("variant") == "bsp" and t.state.name == "COMPLETE" for t in trials)
            assert winners[key].trials == 6
        storage.engine.dispose()
    assert set(winners) == set(keys)
    con = sqlite3.connect(tmp_path / "k.sqlite")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
