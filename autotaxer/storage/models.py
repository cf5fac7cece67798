"""SQLAlchemy models of autotaxer's own tables (prefix ``autotaxer_``; Optuna owns the unprefixed ones).

Migrations in ``migrations/versions`` must produce exactly this schema (``tests/test_migrations.py``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, Float, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.naming import conv

#: Constraint names are deterministic on every backend (and in migrations).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Alembic version table of autotaxer's migrations (Optuna keeps its own in ``alembic_version``).
VERSION_TABLE = "autotaxer_alembic_version"
TABLE_PREFIX = "autotaxer_"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class WinnerRow(Base):
    """The winner of one problem key and the environment it was measured in."""

    __tablename__ = "autotaxer_winners"
    __table_args__ = (
        # The problem key; named in full (conv) so it reads as the key, not as its first column.
        UniqueConstraint(
            "op", "gpu_model", "world_size", "dtype", "shape", "layout", name=conv("uq_autotaxer_winners_key")
        ),
        CheckConstraint("median_us > 0", name="median_positive"),
        CheckConstraint("bsp_us > 0", name="bsp_positive"),
        CheckConstraint("world_size >= 1", name="world_size_positive"),
        CheckConstraint("trials >= 0", name="trials_nonnegative"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # problem key (ProblemKey.shape_text / layout_text for shape and layout)
    op: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(128))
    world_size: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[str] = mapped_column(String(255))
    layout: Mapped[str] = mapped_column(String(255))
    # the winner
    variant: Mapped[str] = mapped_column(String(64))
    params: Mapped[str] = mapped_column(Text)  # JSON object
    median_us: Mapped[float] = mapped_column(Float)
    bsp_us: Mapped[float] = mapped_column(Float)
    speedup: Mapped[float] = mapped_column(Float)  # bsp_us / median_us, kept for SQL queries
    trials: Mapped[int] = mapped_column(Integer)
    # the environment
    device_type: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(64))
    num_sms: Mapped[int] = mapped_column(Integer)
    kernel_hash: Mapped[str | None] = mapped_column(String(128), nullable=True)
    torch_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    triton_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    iris_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    driver_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    env: Mapped[str] = mapped_column(Text)  # JSON object: the record's full environment mapping
    # when
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ClaimRow(Base):
    """A problem key being tuned, and by whom: one row per key, so one tuner at a time tunes it.

    ``owner`` is ``host:pid`` of the tuning process; ``heartbeat`` (seconds since the epoch, the owner's
    clock) is renewed after every trial. A row whose owner is gone (same host, no such process) or whose
    heartbeat is older than the lease may be taken over by a conditional update (compare and set).
    """

    __tablename__ = "autotaxer_claims"
    __table_args__ = (
        UniqueConstraint(
            "op", "gpu_model", "world_size", "dtype", "shape", "layout", name=conv("uq_autotaxer_claims_key")
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    op: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(128))
    world_size: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[str] = mapped_column(String(255))
    layout: Mapped[str] = mapped_column(String(255))
    owner: Mapped[str] = mapped_column(String(255))
    claimed_at: Mapped[float] = mapped_column(Float)
    heartbeat: Mapped[float] = mapped_column(Float)
