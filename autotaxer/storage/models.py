"""SQLAlchemy models of autotaxer's own tables (prefix ``autotaxer_``; Optuna owns the unprefixed ones).

Migrations in ``migrations/versions`` must produce exactly this schema (``tests/storage/test_migrations.py``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    and_,
)
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


#: The problem key's columns (``ProblemKey.shape_text`` / ``layout_text`` for shape and layout).
KEY_COLUMNS = ("op", "gpu_model", "world_size", "dtype", "shape", "layout")


class _ProblemKeyColumns:
    """The problem key as columns, shared by the tables keyed by it (each with its unique constraint)."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    op: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(128))
    world_size: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[str] = mapped_column(String(255))
    layout: Mapped[str] = mapped_column(String(255))


def key_match(table: Any, key: Any) -> Any:
    """The SQL condition selecting ``key``'s row of ``table`` (a table of :class:`_ProblemKeyColumns`)."""
    values = (key.op, key.gpu_model, key.world_size, key.dtype, key.shape_text, key.layout_text)
    return and_(*(table.c[name] == value for name, value in zip(KEY_COLUMNS, values, strict=True)))


class WinnerRow(_ProblemKeyColumns, Base):
    """The winner of one problem key and the environment it was measured in."""

    __tablename__ = "autotaxer_winners"
    __table_args__ = (
        # The problem key; named in full (conv) so it reads as the key, not as its first column.
        UniqueConstraint(*KEY_COLUMNS, name=conv("uq_autotaxer_winners_key")),
        CheckConstraint("median_us > 0", name="median_positive"),
        CheckConstraint("bsp_us > 0", name="bsp_positive"),
        CheckConstraint("world_size >= 1", name="world_size_positive"),
        CheckConstraint("trials >= 0", name="trials_nonnegative"),
    )

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


class ClaimRow(_ProblemKeyColumns, Base):
    """A problem key being tuned, and by whom: one row per key, so one tuner at a time tunes it.

    ``owner`` is ``host:pid`` of the tuning process; ``heartbeat`` (seconds since the epoch, the owner's
    clock) is renewed after every trial. A row whose owner is gone (same host, no such process) or whose
    heartbeat is older than the lease may be taken over by a conditional update (compare and set).
    """

    __tablename__ = "autotaxer_claims"
    __table_args__ = (UniqueConstraint(*KEY_COLUMNS, name=conv("uq_autotaxer_claims_key")),)

    owner: Mapped[str] = mapped_column(String(255))
    claimed_at: Mapped[float] = mapped_column(Float)
    heartbeat: Mapped[float] = mapped_column(Float)
