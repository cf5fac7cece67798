"""Scale-out: two CPU tuners at once against one real PostgreSQL server, on overlapping shape files.

A throwaway server is started on 127.0.0.1 (free port, data in a temp dir) with ``initdb``/``pg_ctl`` from
``$AUTOTAXER_PG_BIN`` or ``/usr/lib/postgresql/*/bin``; as root they run as the ``postgres`` OS user. The
test skips, saying why, only when no server can be started.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _factories import race_for_claim

from autotaxer._problem import ProblemKey
from autotaxer.records import confirmed_times, is_confirmed
from autotaxer.testing import free_port

AUTOTAXER = str(Path(sys.executable).with_name("autotaxer"))


def _pg_bin() -> Path | None:
    candidates = [os.environ.get("AUTOTAXER_PG_BIN", "")]
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _as_db_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL as the postgres user")
    return ["runuser", "-u", "postgres", "--", *cmd]


@pytest.fixture(scope="module")
def postgres_url():
    pytest.importorskip("psycopg2", reason="psycopg2 is not installed")
    pg = _pg_bin()
    if pg is None:
        pytest.skip("no PostgreSQL server binaries (set AUTOTAXER_PG_BIN or install Debian's postgresql)")
    root = Path(tempfile.mkdtemp(prefix="autotaxer-pg-"))
    data, port = root / "data", free_port()
    if os.geteuid() == 0:
        try:
            shutil.chown(root, user="postgres", group="postgres")
        except (LookupError, PermissionError) as e:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"cannot hand the data dir to the postgres user: {e}")
    init = subprocess.run(
        _as_db_user([str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
        capture_output=True,
        text=True,
    )
    if init.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"initdb failed: {init.stderr.strip()[-500:]}")
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
    start = subprocess.run(
        _as_db_user(
            [str(pg / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start"]
        ),
        capture_output=True,
        text=True,
    )
    if start.returncode != 0:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"pg_ctl start failed: {start.stderr.strip()[-300:]} {log[-300:]}")
    try:
        # SQLAlchemy 2.1 defaults to psycopg 3 for postgresql://; the project ships psycopg2-binary.
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_db_user([str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), check=False
        )
        shutil.rmtree(root, ignore_errors=True)


def _key(m: int) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": m, "N": 8, "K": 8}, {"gather_dim": 0})


@pytest.mark.slow
def test_two_tuners_share_one_postgres_database(postgres_url: str, tmp_path: Path) -> None:
    import optuna

    from autotaxer.storage import open_database

    # Schema first (what `autotaxer db upgrade --db URL` does), then the tuners, as the README says.
    db = open_database(postgres_url)
    db.optuna_storage()
    db.close()
    a = tmp_path / "a.csv"
    b = tmp_path / "b.csv"
    a.write_text("M,N,K,dtype\n8,8,8,fp32\n16,8,8,fp32\n24,8,8,fp32\n")
    b.write_text("M,N,K,dtype\n16,8,8,fp32\n24,8,8,fp32\n32,8,8,fp32\n")
    trials = 4
    procs = [
        subprocess.Popen(
            [
                AUTOTAXER,
                "tune",
                "--device",
                "cpu",
                "--world-size",
                "2",
                "--shapes",
                str(f),
                "--db",
                postgres_url,
                "--trials",
                str(trials),
                "--seed",
                str(seed),
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for seed, f in enumerate((a, b))
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    db = open_database(postgres_url)
    try:
        winners = db.winners()
        storage = db.optuna_storage()
        keys = [_key(m) for m in (8, 16, 24, 32)]
        assert sorted(w.key.text for w in winners) == sorted(k.text for k in keys)  # one row per shape
        for key in keys:
            study = optuna.load_study(study_name=key.text, storage=storage)
            states = [t.state.name for t in study.get_trials()]
            finished = states.count("COMPLETE") + states.count("FAIL")
            # Shared shapes may overshoot by one trial per extra tuner (both can ask at the same moment).
            assert trials <= finished <= trials + 1, (key.text, states)
            assert "RUNNING" not in states
            (winner,) = [w for w in winners if w.key == key]
            # the stored time is the end-of-search confirmation's (re-timed beside BSP), not the best trial's
            confirmed = confirmed_times(winner.env)
            assert is_confirmed(winner.env)
            assert winner.median_us == pytest.approx(confirmed[winner.variant], rel=1e-3)  # 4 digits stored
            assert winner.trials == finished
    finally:
        db.close()


@pytest.mark.slow
def test_a_fleet_on_one_postgres_database_tunes_each_key_once(postgres_url: str, tmp_path: Path) -> None:
    """Processes racing for one key's claim (exactly one wins), then two model launches warming up the
    same keys at once (each key tuned by one of them, the other waits for it); `export` makes a table of
    what the fleet tuned."""
    import json

    import optuna
    from typer.testing import CliRunner

    from autotaxer.cli import app
    from autotaxer.storage import open_database
    from autotaxer.table_file import read_table
    from autotaxer.testing.warmup_launch import start

    claims = race_for_claim(postgres_url, _key(99), [f"h{i}:1" for i in range(4)])
    assert all(status == "ok" for status, _, _ in claims), claims
    assert len({holder for _, _, holder in claims}) == 1  # everyone was told the same one owner
    assert sum(me == holder for _, me, holder in claims) == 1

    launches = [start(postgres_url, "40,56", tmp_path / f"{n}.json", tmp_path) for n in ("a", "b")]
    for p in [p for launch in launches for p in launch]:
        assert p.wait(timeout=300) == 0, p.communicate()[1][-3000:]
    reports = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("a", "b")]
    keys = [k for k in reports[0]["served"]]
    assert len(keys) == 4 and set(reports[1]["served"]) == set(keys)
    with open_database(postgres_url) as db:
        storage = db.optuna_storage()
        for key in keys:
            tuned = [
                r for rep in reports for r in rep["results"] if r["key"] == key and r["status"] == "tuned"
            ]
            assert len(tuned) == 1, (key, reports)
            trials = optuna.load_study(study_name=key, storage=storage).get_trials()
            assert len({t.user_attrs.get("owner") for t in trials if t.state.name != "WAITING"}) == 1
    table = tmp_path / "fleet.json"
    result = CliRunner().invoke(
        app, ["export", "--db", postgres_url, "--out", str(table), "--world-size", "2"]
    )
    assert result.exit_code == 0, result.output
    assert set(keys) <= {r.key.text for r in read_table(table)}
