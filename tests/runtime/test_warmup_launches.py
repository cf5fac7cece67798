"""Warm-ups of whole launches on one SQLite database (gloo ranks started as torchrun starts them): a rank
SIGKILLed mid-warm-up loses no finished trial and the next launch resumes; two launches at once tune each
key once. The launches run ``python -m autotaxer.testing.warmup_launch``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from autotaxer.testing.warmup_launch import start


def _launch(tmp: Path, url: str, ms: str, out: Path) -> list[subprocess.Popen]:
    return start(url, ms, out, tmp)


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.communicate()[1]) for p in procs]


def _trials(path: Path) -> list[tuple]:
    """(study, number, state, params, value, owner) of every trial, read with plain sqlite3; an
    interrupted trial's state is ``INTERRUPTED`` (Optuna's FAIL, marked so: its configuration runs again)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute(
            "SELECT s.study_name, t.trial_id, t.number, t.state, v.value FROM trials t "
            "JOIN studies s ON s.study_id = t.study_id LEFT JOIN trial_values v ON v.trial_id = t.trial_id"
        ).fetchall()
        params = con.execute("SELECT trial_id, param_name, param_value FROM trial_params").fetchall()
        attrs = "SELECT trial_id, value_json FROM trial_user_attributes WHERE key = ?"
        owners = dict(con.execute(attrs, ("owner",)))
        interrupted = dict(con.execute(attrs, ("interrupted",)))
    finally:
        con.close()
    by_trial: dict[int, list] = {}
    for tid, name, value in params:
        by_trial.setdefault(tid, []).append((name, value))
    return [
        (
            study,
            number,
            "INTERRUPTED" if tid in interrupted else state,
            tuple(sorted(by_trial.get(tid, []))),
            value,
            owners.get(tid),
        )  # fmt: skip
        for study, tid, number, state, value in rows
    ]


def _winners(url: str) -> dict:
    from autotaxer.records import is_partial
    from autotaxer.storage import open_database

    with open_database(url) as db:
        return {w.key.text: (w.variant, is_partial(w.env)) for w in db.winners()}


def _complete(path: Path) -> int:
    try:
        return sum(state == "COMPLETE" for _, _, state, *_ in _trials(path))
    except sqlite3.Error:  # not created yet
        return 0


@pytest.mark.slow
def test_a_rank_killed_mid_warm_up_loses_no_finished_trial_and_the_next_launch_resumes(tmp_path) -> None:
    path = tmp_path / "warm.sqlite"
    url = f"sqlite:///{path}"
    ms = "16,32,48,64"  # 8 keys, up to 4 trials each: time to kill in the middle
    first = _launch(tmp_path, url, ms, tmp_path / "first.json")
    deadline = time.monotonic() + 240
    while _complete(path) < 3 and time.monotonic() < deadline and first[1].poll() is None:
        time.sleep(0.1)
    assert first[1].poll() is None, "the warm-up ended before it could be killed"
    os.kill(first[1].pid, signal.SIGKILL)
    try:
        first[0].wait(timeout=120)  # rank 0 learns its peer is gone and ends
    except subprocess.TimeoutExpired:
        first[0].kill()
    _finish(first)
    before = {
        (s, n): (params, value) for s, n, state, params, value, _ in _trials(path) if state == "COMPLETE"
    }
    assert before, "no trial had finished"
    assert not (tmp_path / "first.json").exists()  # that launch did not get to the end

    second = _launch(tmp_path, url, ms, tmp_path / "second.json")
    for rc, err in _finish(second):
        assert rc == 0, err[-3000:]
    after = _trials(path)
    complete = {(s, n): (params, value) for s, n, state, params, value, _ in after if state == "COMPLETE"}
    assert all(complete.get(k) == v for k, v in before.items())  # every finished trial kept, as it was
    assert "RUNNING" not in {state for _, _, state, *_ in after}
    for study in {s for s, *_ in after}:  # resumed, not started over: no configuration ran twice
        ran = [params for s, _, state, params, *_ in after if s == study and state in ("COMPLETE", "FAIL")]
        assert len(ran) == len(set(ran)), study
    winners = _winners(url)
    assert len(winners) == 8 and not any(partial for _, partial in winners.values())
    report = json.loads((tmp_path / "second.json").read_text())
    assert report["results"], "the second launch had nothing to resume"
    assert all(r["status"] == "tuned" for r in report["results"])
    assert all(source == "exact" for _, source in report["served"].values())
    assert report["max_error"] < 1e-4


@pytest.mark.slow
def test_two_launches_at_once_on_one_database_tune_each_key_once(tmp_path) -> None:
    path = tmp_path / "warm.sqlite"
    url = f"sqlite:///{path}"
    a = _launch(tmp_path, url, "16,32", tmp_path / "a.json")
    b = _launch(tmp_path, url, "16,32", tmp_path / "b.json")
    for rc, err in _finish(a + b):
        assert rc == 0, err[-3000:]
    reports = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("a", "b")]
    winners = _winners(url)
    assert len(winners) == 4
    for key in winners:
        tuned_by = [
            i
            for i, rep in enumerate(reports)
            for r in rep["results"]
            if r["key"] == key and r["status"] == "tuned"
        ]
        assert len(tuned_by) == 1, (
            key,
            reports,
        )  # one launch tuned it; the other found it, or had it already
        owners = {owner for s, _, state, _, _, owner in _trials(path) if s == key and state != "WAITING"}
        assert len(owners) == 1, (key, owners)  # every trial of the key ran in one process
    for rep in reports:
        assert set(rep["served"]) == set(winners) and all(s == "exact" for _, s in rep["served"].values())
        assert rep["max_error"] < 1e-4
