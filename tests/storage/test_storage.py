"""The tuning database: open/WAL, upsert policy, filters, round trips, Optuna sharing the database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _factories import make_key, make_record
from sqlalchemy import text

from autotaxer.records import WinnerRecord
from autotaxer.storage import DatabaseError, _winners, default_url, open_database


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/t.sqlite"


@pytest.fixture
def db(url):
    database = open_database(url)
    yield database
    database.close()


def test_default_url(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTAXER_DB", "postgresql://u@h/db")
    assert default_url() == "postgresql://u@h/db"
    monkeypatch.delenv("AUTOTAXER_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_url() == f"sqlite:///{tmp_path}/autotaxer/tuning.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_url() == f"sqlite:///{Path.home()}/.local/share/autotaxer/tuning.sqlite"


def test_open_default_creates_parent_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOTAXER_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with open_database() as database:
        assert database.current_revision() == "0002"
    assert (tmp_path / "data" / "autotaxer" / "tuning.sqlite").is_file()


def test_sqlite_wal_and_busy_timeout(db):
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000


def test_bad_url():
    with pytest.raises(DatabaseError, match="not a valid SQLAlchemy URL"):
        open_database("not a url")
    with pytest.raises(DatabaseError, match="cannot create an engine"):
        open_database("nosuchdialect://x/y")


def test_round_trip(db):
    rec = make_record()
    assert db.get_winner(rec.key) is None
    assert db.upsert_winner(rec) is True
    assert db.get_winner(rec.key) == rec
    assert db.get_winner(make_key(m=65)) is None


def test_keep_faster_unless_replace(db):
    key = make_key()
    assert db.upsert_winner(make_record(median_us=10.0, variant="push"))
    assert not db.upsert_winner(make_record(median_us=12.0, variant="pull"))  # slower: kept
    assert not db.upsert_winner(make_record(median_us=10.0, variant="pull"))  # equal: kept
    assert db.get_winner(key).variant == "push"
    assert db.upsert_winner(make_record(median_us=9.0, variant="pull"))  # faster: written
    assert db.get_winner(key).variant == "pull"
    assert db.upsert_winner(make_record(median_us=20.0, variant="bsp"), replace=True)
    assert db.get_winner(key).median_us == 20.0 and db.get_winner(key).variant == "bsp"


def test_a_record_timed_in_another_mode_is_replaced_not_compared(db):
    from dataclasses import replace

    key = make_key()
    eager = make_record(median_us=10.0, variant="push")  # no "timing" stamp: an eager record
    graph = replace(make_record(median_us=20.0, variant="bsp"), env={**eager.env, "timing": "graph"})
    assert db.upsert_winner(eager)
    assert db.upsert_winner(graph)  # slower, but graph-timed: it replaces the eager record
    assert db.get_winner(key).env["timing"] == "graph"
    slower_graph = replace(graph, median_us=25.0, variant="pull")
    assert not db.upsert_winner(slower_graph)  # same mode: the faster one stays
    back = replace(eager, env={**eager.env, "timing": "eager"}, median_us=30.0)
    assert db.upsert_winners([back]) == (1, 0)  # eager again: replaces whatever it is compared to
    assert db.get_winner(key).variant == "push" and db.get_winner(key).median_us == 30.0


def test_timestamps_and_environment_columns(db):
    db.upsert_winner(make_record(median_us=10.0))
    with db.engine.connect() as conn:
        row1 = conn.execute(text("SELECT * FROM autotaxer_winners")).mappings().one()
    db.upsert_winner(make_record(median_us=5.0))
    with db.engine.connect() as conn:
        row2 = conn.execute(text("SELECT * FROM autotaxer_winners")).mappings().one()
    assert row2["created_at"] == row1["created_at"] and row2["updated_at"] > row1["updated_at"]
    assert (row2["torch_version"], row2["triton_version"], row2["iris_version"]) == (
        "2.13.0",
        "3.9.0",
        "0.0.1",
    )
    assert row2["driver_version"] == "12.8" and row2["kernel_hash"] == "abc123"
    assert (row2["arch"], row2["num_sms"], row2["device_type"]) == ("sm_90", 132, "cuda")
    assert row2["shape"] == "M=64,N=8192,K=8192" and row2["layout"] == "gather_dim=0"
    assert row2["speedup"] == pytest.approx(3.0)
    assert json.loads(row2["params"])["order"] == "rotated"


def test_upsert_winners_counts_and_filters(db):
    recs = [make_record(m) for m in (1024, 16, 256)]
    recs += [
        make_record(16, gpu="nvidia-h100-80gb-hbm3"),
        make_record(16, ws=4),
        make_record(16, op="other_op"),
    ]
    assert db.upsert_winners(recs) == (6, 0)
    assert db.upsert_winners([make_record(16, median_us=99.0), make_record(16, median_us=1.0, ws=4)]) == (
        1,
        1,
    )
    assert [r.key["M"] for r in db.winners(gpu_model="nvidia-h200", world_size=2, op="ag_gemm")] == [
        16,
        256,
        1024,
    ]
    assert len(db.winners()) == 6
    assert [r.key.gpu_model for r in db.winners(gpu_model="nvidia-h100-80gb-hbm3")] == [
        "nvidia-h100-80gb-hbm3"
    ]
    assert [r.median_us for r in db.winners(world_size=4)] == [1.0]
    assert [r.key.op for r in db.winners(op="other_op")] == ["other_op"]
    assert db.winners(gpu_model="amd-instinct-mi300x") == []


def test_upsert_winners_is_all_or_nothing(db):
    db.upsert_winner(make_record(16))
    too_long = WinnerRecord(make_key(32), "v" * 65, {}, 1.0, 2.0, 1)
    with pytest.raises(ValueError, match="field 'variant': longer than 64"):
        db.upsert_winners([make_record(8), make_record(16, median_us=1.0), too_long])
    assert [(r.key["M"], r.median_us) for r in db.winners()] == [(16, 10.0)]


def test_session_scope_rolls_back(db):
    with pytest.raises(RuntimeError):
        with db.session_scope() as session:
            _winners.write_one(session, make_record(8), False, db.display_url)
            raise RuntimeError("boom")
    assert db.winners() == []


def test_delete_winner(db):
    db.upsert_winner(make_record(16))
    assert db.delete_winner(make_key(16)) is True
    assert db.delete_winner(make_key(16)) is False
    assert db.get_winner(make_key(16)) is None


def test_optuna_shares_the_database(url, db):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=db.optuna_storage(), study_name="ag_gemm|x")
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    db.upsert_winner(make_record())
    db.close()
    with open_database(url) as again:
        assert again.current_revision() == "0002" and len(again.winners()) == 1
        with again.engine.connect() as conn:
            tables = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")}
            optuna_rev = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    assert {
        "studies",
        "trials",
        "alembic_version",
        "autotaxer_alembic_version",
        "autotaxer_winners",
    } <= tables
    assert optuna_rev != "0001"
    loaded = optuna.load_study(study_name="ag_gemm|x", storage=again.optuna_storage())
    assert len(loaded.trials) == 2


def test_storage_import_is_light():
    code = (
        "import sys, autotaxer.storage as s; s.DatabaseError; s.default_url(); "
        "print('sqlalchemy' in sys.modules); s.open_database; print('sqlalchemy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
