"""Alembic environment and versions of autotaxer's tuning database (driven from code, no alembic.ini).

See :mod:`autotaxer.storage._migrate`: ``script_location`` is this package's folder and the version
table is ``autotaxer_alembic_version`` (Optuna keeps its own revision in ``alembic_version``).
"""
