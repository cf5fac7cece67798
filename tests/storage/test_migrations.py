"""Migrations: a single head, ``upgrade head`` == the models, and a downgrade/upgrade round trip with data."""

from __future__ import annotations

from pathlib import Path

import pytest
from _factories import make_record
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from autotaxer.storage import _migrate, open_database
from autotaxer.storage.models import VERSION_TABLE, Base

VERSIONS = Path(_migrate.__file__).resolve().parents[2] / "migrations" / "versions"


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/m.sqlite"


def _autotaxer_tables(name, type_, parent_names):
    return type_ != "table" or (name.startswith("autotaxer_") and name != VERSION_TABLE)


def test_single_head():
    assert _migrate.script_directory().get_heads() == [_migrate.head_revision()]
    assert _migrate.head_revision() == "0002"


def test_upgrade_head_matches_models(url):
    with open_database(url) as db:
        with db.engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "include_name": _autotaxer_tables}
            )
            assert compare_metadata(ctx, Base.metadata) == []
            insp = inspect(conn)
            uniques = insp.get_unique_constraints("autotaxer_winners")
            checks = {c["name"] for c in insp.get_check_constraints("autotaxer_winners")}
            pk = insp.get_pk_constraint("autotaxer_winners")
            claims = insp.get_unique_constraints("autotaxer_claims")
    assert [(u["name"], u["column_names"]) for u in claims] == [
        ("uq_autotaxer_claims_key", ["op", "gpu_model", "world_size", "dtype", "shape", "layout"])
    ]
    assert [(u["name"], u["column_names"]) for u in uniques] == [
        ("uq_autotaxer_winners_key", ["op", "gpu_model", "world_size", "dtype", "shape", "layout"])
    ]
    assert checks == {
        "ck_autotaxer_winners_median_positive",
        "ck_autotaxer_winners_bsp_positive",
        "ck_autotaxer_winners_world_size_positive",
        "ck_autotaxer_winners_trials_nonnegative",
    }
    assert pk["name"] == "pk_autotaxer_winners"


def test_models_differ_from_an_empty_database_is_detected(tmp_path):
    # The comparison above could pass vacuously; an un-migrated database must show differences.
    engine = create_engine(f"sqlite:///{tmp_path}/empty.sqlite")
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"include_name": _autotaxer_tables})
        assert [d[0] for d in compare_metadata(ctx, Base.metadata)] == ["add_table", "add_table"]
    engine.dispose()


def test_downgrade_base_then_upgrade_with_data(url):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with open_database(url) as db:
        optuna.create_study(storage=db.optuna_storage(), study_name="keep-me")
        db.upsert_winner(make_record(16))
        with db.engine.begin() as conn:
            _migrate.downgrade(conn, "base")
        assert db.current_revision() is None
        tables = set(inspect(db.engine).get_table_names())
        assert "autotaxer_winners" not in tables
        assert {"studies", "alembic_version"} <= tables  # Optuna's tables are not autotaxer's to drop
    with open_database(url) as db:
        assert db.current_revision() == "0002"
        assert db.winners() == []
        db.upsert_winner(make_record(32))
        assert [r.key["M"] for r in db.winners()] == [32]
        assert optuna.load_study(study_name="keep-me", storage=db.optuna_storage()).study_name == "keep-me"


def test_a_0001_database_with_data_upgrades_to_claims(url):
    """A database of the first schema (winners only) keeps its winners and gains the claims table."""
    with open_database(url) as db:
        db.upsert_winner(make_record(16))
        with db.engine.begin() as conn:
            _migrate.downgrade(conn, "0001")
        assert db.current_revision() == "0001"
        assert "autotaxer_claims" not in inspect(db.engine).get_table_names()
    with open_database(url) as db:
        assert db.current_revision() == "0002"
        assert [r.key["M"] for r in db.winners()] == [16]
        assert db.claim_of(make_record(16).key) is None


def test_open_without_upgrade_leaves_schema_alone(url):
    with open_database(url, upgrade=False) as db:
        assert db.current_revision() is None
        assert inspect(db.engine).get_table_names() == []


def test_migrations_do_not_import_live_models():
    scripts = sorted(p for p in VERSIONS.glob("*.py") if p.name != "__init__.py")
    assert scripts, VERSIONS
    for path in scripts:
        source = path.read_text()
        assert "autotaxer" not in source.replace("autotaxer_", ""), path.name
