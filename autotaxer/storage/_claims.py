"""Claims on problem keys: one tuner at a time tunes a key, across every host of a shared database.

A claim is a row of ``autotaxer_claims`` (one per key, a unique constraint): taking a free key is an
insert, which a racing tuner's insert of the same key turns into an ``IntegrityError`` (it then reads the
winner's row); taking over a claim whose owner is gone is a conditional update that matches only the row
as it was read (owner and heartbeat: compare and set), so two tuners that both find a claim abandoned
cannot both take it. SQLite transactions begin ``IMMEDIATE`` (see :mod:`._engine`), PostgreSQL's
conditional update locks the row: both serialise the read and the write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy import exc as sa_exc

from .._problem import ProblemKey
from .models import ClaimRow, key_match

_CLAIMS = ClaimRow.__table__
_RETRIES = 5


@dataclass(frozen=True)
class Claim:
    """Who tunes ``key``: ``owner`` (``host:pid``), since ``claimed_at``, alive at ``heartbeat`` (epoch s)."""

    key: ProblemKey
    owner: str
    claimed_at: float
    heartbeat: float


def _match(key: ProblemKey) -> Any:
    return key_match(_CLAIMS, key)


def _claim(key: ProblemKey, row: Any) -> Claim:
    return Claim(key, row["owner"], float(row["claimed_at"]), float(row["heartbeat"]))


def acquire(db: Any, key: ProblemKey, owner: str, abandoned: Callable[[Claim], bool]) -> Claim:
    """Take the claim on ``key`` for ``owner`` when it is free, already ``owner``'s (renewed), or held by an
    owner that ``abandoned`` says is gone; returns the claim as it stands after the attempt (compare its
    ``owner`` with yours)."""
    for _ in range(_RETRIES):
        now = time.time()
        with db.session_scope() as session:
            row = session.execute(select(_CLAIMS).where(_match(key))).mappings().first()
            if row is None:
                values = dict(
                    op=key.op, gpu_model=key.gpu_model, world_size=key.world_size, dtype=key.dtype,
                    shape=key.shape_text, layout=key.layout_text, owner=owner, claimed_at=now, heartbeat=now,
                )  # fmt: skip
                try:
                    with session.begin_nested():
                        session.execute(insert(_CLAIMS).values(**values))
                except sa_exc.IntegrityError:  # a racing tuner inserted it first: read its row again
                    continue
                return Claim(key, owner, now, now)
            held = _claim(key, row)
            if held.owner != owner and not abandoned(held):
                return held
            same = and_(_match(key), _CLAIMS.c.owner == held.owner, _CLAIMS.c.heartbeat == held.heartbeat)
            taken = held.claimed_at if held.owner == owner else now
            stmt = update(_CLAIMS).where(same).values(owner=owner, claimed_at=taken, heartbeat=now)
            if session.execute(stmt).rowcount == 1:
                return Claim(key, owner, taken, now)
    current = holder(db, key)
    return current if current is not None else Claim(key, "", 0.0, 0.0)


def renew(db: Any, key: ProblemKey, owner: str) -> bool:
    """Refresh ``owner``'s heartbeat on ``key``; False when the claim is no longer ``owner``'s."""
    with db.session_scope() as session:
        stmt = update(_CLAIMS).where(_match(key), _CLAIMS.c.owner == owner).values(heartbeat=time.time())
        return session.execute(stmt).rowcount == 1


def release(db: Any, key: ProblemKey, owner: str) -> bool:
    """Drop ``owner``'s claim on ``key`` (another owner's is left alone); True when one was dropped."""
    with db.session_scope() as session:
        return session.execute(delete(_CLAIMS).where(_match(key), _CLAIMS.c.owner == owner)).rowcount == 1


def holder(db: Any, key: ProblemKey) -> Claim | None:
    """The claim on ``key``, or None when nobody tunes it."""
    with db.session_scope() as session:
        row = session.execute(select(_CLAIMS).where(_match(key))).mappings().first()
        return None if row is None else _claim(key, row)
