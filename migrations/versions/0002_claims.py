"""Claims: the problem keys being tuned, one row per key (one tuner at a time tunes a key).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotaxer_claims",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("op", sa.String(length=64), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("shape", sa.String(length=255), nullable=False),
        sa.Column("layout", sa.String(length=255), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", sa.Float(), nullable=False),
        sa.Column("heartbeat", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotaxer_claims")),
        sa.UniqueConstraint(
            "op", "gpu_model", "world_size", "dtype", "shape", "layout", name=op.f("uq_autotaxer_claims_key")
        ),
    )


def downgrade() -> None:
    op.drop_table("autotaxer_claims")
