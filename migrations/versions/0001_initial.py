"""Initial schema: the winners table.

Revision ID: 0001
Revises:
Create Date: 2026-05-16
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autotaxer_winners",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("op", sa.String(length=64), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("shape", sa.String(length=255), nullable=False),
        sa.Column("layout", sa.String(length=255), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("median_us", sa.Float(), nullable=False),
        sa.Column("bsp_us", sa.Float(), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("device_type", sa.String(length=16), nullable=False),
        sa.Column("arch", sa.String(length=64), nullable=False),
        sa.Column("num_sms", sa.Integer(), nullable=False),
        sa.Column("kernel_hash", sa.String(length=128), nullable=True),
        sa.Column("torch_version", sa.String(length=64), nullable=True),
        sa.Column("triton_version", sa.String(length=64), nullable=True),
        sa.Column("iris_version", sa.String(length=64), nullable=True),
        sa.Column("driver_version", sa.String(length=64), nullable=True),
        sa.Column("env", sa.Text(), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("median_us > 0", name=op.f("ck_autotaxer_winners_median_positive")),
        sa.CheckConstraint("bsp_us > 0", name=op.f("ck_autotaxer_winners_bsp_positive")),
        sa.CheckConstraint("world_size >= 1", name=op.f("ck_autotaxer_winners_world_size_positive")),
        sa.CheckConstraint("trials >= 0", name=op.f("ck_autotaxer_winners_trials_nonnegative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autotaxer_winners")),
        sa.UniqueConstraint(
            "op", "gpu_model", "world_size", "dtype", "shape", "layout", name=op.f("uq_autotaxer_winners_key")
        ),
    )


def downgrade() -> None:
    op.drop_table("autotaxer_winners")
