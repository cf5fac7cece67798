"""The winners table: one record per problem key, the fastest measured (a record timed in another mode
replaces it), written in one transaction per batch, safe against racing writers of the same key."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from .._problem import ProblemKey
from ..records import WinnerRecord, timing_of, to_utc
from ._url import DatabaseError
from .models import WinnerRow, key_match

_RACE_RETRIES = 5
_WINNERS = WinnerRow.__table__
_LIMITS = {"op": 64, "gpu_model": 128, "dtype": 16, "shape": 255, "layout": 255, "variant": 64, "arch": 64}


def upsert(db: Any, recs: Iterable[WinnerRecord], replace: bool = False) -> tuple[int, int]:
    """Store ``recs`` in ONE transaction of ``db`` (all or nothing), each unless a faster record of its
    key, timed the same way, exists (``replace``: always); returns ``(written, kept)``."""
    recs = list(recs)
    written = 0
    with db.session_scope() as session:
        for rec in recs:
            written += write_one(session, rec, replace, db.display_url)
    return written, len(recs) - written


def write_one(session: Session, rec: WinnerRecord, replace: bool, where: str) -> bool:
    """Store ``rec`` in ``session``'s transaction (see :func:`upsert`); True if written. ``where`` names
    the database in the error raised when racing writers keep it from storing."""
    values = _row_values(rec)
    match = _key_clause(rec.key)
    if not replace:
        # Times measured in different modes (eager back-to-back vs CUDA-graph replay) do not compare:
        # a record of another mode is replaced, never kept for being "faster".
        stored = session.execute(select(_WINNERS.c.env).where(match)).scalar_one_or_none()
        replace = stored is not None and timing_of(json.loads(stored)) != timing_of(rec.env)
    for _ in range(_RACE_RETRIES):
        now = datetime.now(timezone.utc)
        # A conditional UPDATE is atomic, so two writers of one key always keep the faster record.
        stmt = update(_WINNERS).where(match).values(**values, updated_at=now)
        if not replace:
            stmt = stmt.where(_WINNERS.c.median_us > rec.median_us)
        if session.execute(stmt).rowcount:
            return True
        if session.execute(select(_WINNERS.c.id).where(match)).first() is not None:
            return False  # the stored record is at least as fast
        try:
            with session.begin_nested():
                session.execute(insert(_WINNERS).values(**values, created_at=now, updated_at=now))
            return True
        except sa_exc.IntegrityError:
            time.sleep(0.01)  # a racing process inserted this key: compare against its record
    raise DatabaseError(f"{where}: could not store {rec.key.text} after {_RACE_RETRIES} tries")


def get(db: Any, key: ProblemKey) -> WinnerRecord | None:
    """The stored winner of ``key``, or None."""
    with db.session_scope() as session:
        row = session.execute(select(_WINNERS).where(_key_clause(key))).mappings().first()
        return None if row is None else _to_record(row)


def matching(
    db: Any, op: str | None = None, gpu_model: str | None = None, world_size: int | None = None
) -> list[WinnerRecord]:
    """Stored winners matching the filters, ordered by key (shapes numerically)."""
    stmt = select(_WINNERS)
    if op is not None:
        stmt = stmt.where(_WINNERS.c.op == op)
    if gpu_model is not None:
        stmt = stmt.where(_WINNERS.c.gpu_model == gpu_model)
    if world_size is not None:
        stmt = stmt.where(_WINNERS.c.world_size == world_size)
    with db.session_scope() as session:
        recs = [_to_record(row) for row in session.execute(stmt).mappings()]
    return sorted(recs, key=lambda r: _sort_key(r.key))


def delete(db: Any, key: ProblemKey) -> bool:
    """Remove the winner of ``key``; True when there was one."""
    with db.session_scope() as session:
        return bool(session.execute(_WINNERS.delete().where(_key_clause(key))).rowcount)


def _key_clause(key: ProblemKey):
    return key_match(_WINNERS, key)


def _row_values(rec: WinnerRecord) -> dict[str, Any]:
    k = rec.key
    env = dict(rec.env)
    values = {
        "op": k.op,
        "gpu_model": k.gpu_model,
        "world_size": k.world_size,
        "dtype": k.dtype,
        "shape": k.shape_text,
        "layout": k.layout_text,
        "variant": rec.variant,
        "params": json.dumps(dict(rec.params), allow_nan=False),
        "median_us": rec.median_us,
        "bsp_us": rec.bsp_us,
        "speedup": rec.speedup,
        "trials": rec.trials,
        "device_type": rec.device_type,
        "arch": rec.arch,
        "num_sms": rec.num_sms,
        "kernel_hash": rec.kernel_hash,
        "torch_version": _short(env.get("torch")),
        "triton_version": _short(env.get("triton")),
        "iris_version": _short(env.get("iris")),
        "driver_version": _short(env.get("cuda_or_hip")),
        "env": json.dumps(env),
        "measured_at": rec.measured_at,
    }
    for name, limit in _LIMITS.items():
        if len(values[name]) > limit:
            raise ValueError(f"{k.text}: field {name!r}: longer than {limit} characters")
    return values


def _short(value: str | None) -> str | None:
    return None if value is None else value[:64]


def _to_record(row: Any) -> WinnerRecord:
    key = ProblemKey.from_text(
        "|".join(
            [row["op"], row["gpu_model"], str(row["world_size"]), row["dtype"], row["shape"], row["layout"]]
        )
    )
    return WinnerRecord(
        key=key,
        variant=row["variant"],
        params=json.loads(row["params"]),
        median_us=row["median_us"],
        bsp_us=row["bsp_us"],
        trials=row["trials"],
        arch=row["arch"],
        num_sms=row["num_sms"],
        env=json.loads(row["env"]),
        kernel_hash=row["kernel_hash"],
        measured_at=to_utc(row["measured_at"]),
        device_type=row["device_type"],
    )


def _sort_key(key: ProblemKey) -> tuple:
    return (key.op, key.gpu_model, key.world_size, key.dtype, key.shape, key.layout)
