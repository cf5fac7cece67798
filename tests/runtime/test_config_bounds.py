"""Bounds of a runtime's waits (issue 48): a bound the kernels' int64 nanosecond counters cannot hold is
refused by name when the config is made, not later by an ``OverflowError`` in the peer watch."""

from __future__ import annotations

import pytest

from autotaxer import RuntimeConfig


@pytest.mark.parametrize("field", ["peer_timeout_s", "first_call_timeout_s", "agree_timeout_s"])
def test_a_wait_bound_beyond_a_day_is_refused_by_name(field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: at most 86400 seconds"):
        RuntimeConfig(**{field: 1e10}, shipped_tables=False, env_tables=False).validate()
    RuntimeConfig(**{field: 86400.0}, shipped_tables=False, env_tables=False).validate()


def test_a_peer_timeout_from_the_environment_beyond_a_day_is_refused_by_name(monkeypatch) -> None:
    monkeypatch.setenv("AUTOTAXER_PEER_TIMEOUT", "1e10")
    with pytest.raises(ValueError, match=r"^\$AUTOTAXER_PEER_TIMEOUT: at most 86400 seconds"):
        RuntimeConfig(shipped_tables=False, env_tables=False).validate()
