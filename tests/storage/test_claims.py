"""Claims on problem keys (one tuner at a time per key): taking, renewing, releasing, taking over an
abandoned claim, and processes racing for one key on one SQLite file (exactly one wins)."""

from __future__ import annotations

import time

import pytest
from _factories import make_key, race_for_claim

from autotaxer.storage import open_database

NEVER = lambda claim: False  # noqa: E731  (no claim is abandoned)
ALWAYS = lambda claim: True  # noqa: E731


@pytest.fixture
def db(tmp_path):
    with open_database(f"sqlite:///{tmp_path}/c.sqlite") as database:
        yield database


def test_a_free_key_is_taken_and_a_held_one_is_refused(db) -> None:
    key = make_key(16)
    assert db.claim_of(key) is None
    mine = db.claim(key, "host-a:1", NEVER)
    assert mine.owner == "host-a:1" and db.claim_of(key).owner == "host-a:1"
    theirs = db.claim(key, "host-b:2", NEVER)
    assert theirs.owner == "host-a:1"  # refused: the holder is returned
    assert db.claim_of(make_key(32)) is None  # claims are per key


def test_the_owner_renews_and_keeps_its_start(db) -> None:
    key = make_key(16)
    first = db.claim(key, "host-a:1", NEVER)
    time.sleep(0.01)
    again = db.claim(key, "host-a:1", NEVER)
    assert again.owner == "host-a:1" and again.claimed_at == first.claimed_at
    assert again.heartbeat > first.heartbeat
    time.sleep(0.01)
    assert db.renew_claim(key, "host-a:1")
    assert db.claim_of(key).heartbeat > again.heartbeat
    assert not db.renew_claim(key, "host-b:2")  # not its claim


def test_release_only_by_the_owner(db) -> None:
    key = make_key(16)
    db.claim(key, "host-a:1", NEVER)
    assert not db.release_claim(key, "host-b:2")
    assert db.claim_of(key).owner == "host-a:1"
    assert db.release_claim(key, "host-a:1")
    assert db.claim_of(key) is None
    assert db.claim(key, "host-b:2", NEVER).owner == "host-b:2"


def test_an_abandoned_claim_is_taken_over(db) -> None:
    key = make_key(16)
    db.claim(key, "host-a:1", NEVER)
    seen = []

    def abandoned(claim) -> bool:
        seen.append(claim.owner)
        return claim.owner == "host-a:1"

    taken = db.claim(key, "host-b:2", abandoned)
    assert seen == ["host-a:1"] and taken.owner == "host-b:2"
    assert db.claim_of(key).owner == "host-b:2"
    assert not db.renew_claim(key, "host-a:1")  # the old owner learns it lost the claim


@pytest.mark.parametrize("abandoned", [False, True], ids=["free-key", "abandoned-claim"])
def test_processes_racing_for_a_key_leave_exactly_one_owner(tmp_path, abandoned: bool) -> None:
    """Four processes claim one key at the same moment, on a free key and on a key whose claim every one
    of them finds abandoned (a take-over is a compare and set: only one succeeds)."""
    url = f"sqlite:///{tmp_path}/race.sqlite"
    key = make_key(16)
    with open_database(url) as db:
        if abandoned:
            db.claim(key, "dead-host:1", NEVER)
    owners = [f"host-{i}:{100 + i}" for i in range(4)]
    results = race_for_claim(url, key, owners, "dead-host:1")
    assert all(status == "ok" for status, _, _ in results), results
    winners = {me for _, me, holder in results if holder == me}
    assert len(winners) == 1, results  # exactly one took it ...
    (winner,) = winners
    assert all(holder == winner for _, _, holder in results)  # ... and every other one was told who
    with open_database(url) as db:
        assert db.claim_of(key).owner == winner
