"""Warm-up's joint check (one process, CPU): winners that each speed the step up by less than the check's
1% floor are turned down one by one, then kept together when together they pass it, and stay ``bsp``
when together they do not.

Planted winners at three (or two) M compute what BSP computes and win their isolated trials (BSP is
delayed there). Inside the check the step's time is synthetic (``in_step._timed`` replaced): a base time
plus ``per_key`` of it for every call the step made through BSP, so each winner alone gains ``per_key``
(below the floor) and the winners together ``keys * per_key``; the step itself still runs, through
dispatch, with whatever the check serves.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import autotaxer
from autotaxer.ops.ag_gemm.bsp import BspVariant

N = K = 8
#: What BSP costs more than the planted winner in isolated trials (seconds a call).
TRIAL_DELAY_S = 0.02
#: The synthetic step's base time (seconds).
BASE_S = 0.01
CALLS: list[str] = []  # the variants the running step called
IN_STEP = {"on": False}


class NearMiss(BspVariant):
    """BSP's computation: faster than the delayed BSP in isolation, barely faster in the step."""

    name = "planted_near_miss"
    is_baseline = False
    device_types = frozenset({"cpu"})

    def run(self, ws, inputs, ctx, out=None) -> Any:
        CALLS.append(self.name)
        return super().run(ws, inputs, ctx, out)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    from autotaxer.ops import get_op

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("AUTOTAXER_DB", f"sqlite:///{tmp_path}/default.sqlite")
    op = get_op("ag_gemm")
    monkeypatch.setitem(op._variants, NearMiss.name, NearMiss())
    bsp = op.variants["bsp"]
    plain = bsp.run

    def delayed(ws, inputs, ctx, out=None):
        if IN_STEP["on"]:
            CALLS.append("bsp")
        else:
            time.sleep(TRIAL_DELAY_S)
        return plain(ws, inputs, ctx, out)

    monkeypatch.setattr(bsp, "run", delayed)
    url = f"sqlite:///{tmp_path}/joint.sqlite"
    config = autotaxer.RuntimeConfig(db_url=url, shipped_tables=False, env_tables=False, persist_misses=False)
    runtime = autotaxer.init(config)
    yield runtime, url
    from autotaxer.runtime.dispatch import shutdown

    shutdown()


def _synthetic_timing(monkeypatch, per_key: float) -> None:
    import autotaxer.tuner.in_step as in_step

    def timed(step_fn, args, world) -> float:
        CALLS.clear()
        IN_STEP["on"] = True
        try:
            step_fn(*args)
        finally:
            IN_STEP["on"] = False
        return BASE_S * (1 + per_key * CALLS.count("bsp"))

    monkeypatch.setattr(in_step, "_timed", timed)


def _step(ms: tuple[int, ...]):
    import torch

    gen = torch.Generator().manual_seed(3)
    b = torch.randn(K, N, generator=gen)
    shards = [torch.randn(m, K, generator=gen) for m in ms]

    def step() -> list[Any]:
        return [autotaxer.dispatch("ag_gemm", a, b, gather_dim=0) for a in shards]

    return step, [a @ b for a in shards]


def _key(m: int) -> str:
    return f"ag_gemm|cpu|1|fp32|M={m},N={N},K={K}|gather_dim=0"


def _stored(url: str) -> dict[str, Any]:
    from autotaxer.storage import open_database

    with open_database(url) as db:
        return {w.key.text: w for w in db.winners()}


@pytest.mark.parametrize(
    ("ms", "per_key", "together"),
    [
        ((16, 32, 48), 0.005, True),  # 0.5% each: every one below the floor, 1.5% together: kept
        ((16, 32), 0.004, False),  # 0.4% each, 0.8% together: still below the floor, bsp stays
    ],
)
def test_near_misses_are_kept_together_only_when_together_they_pass(
    planted, monkeypatch, ms, per_key, together
) -> None:
    from autotaxer.cli.show import in_step_text
    from autotaxer.records import IN_STEP_JOINT, IN_STEP_WINNER, in_step_of

    runtime, url = planted
    _synthetic_timing(monkeypatch, per_key)
    step, expected = _step(ms)
    # budget far above the few seconds a run takes: each key gets a share of what is left, and under CI's
    # parallel load a 120 s budget once left the last key (M=48) bsp
    report = autotaxer.warmup(
        step, budget_s=900, trials=2, variants=(NearMiss.name,), seed_nearby=False, progress=False
    )
    assert {r.key: r.variant for r in report.results} == {_key(m): NearMiss.name for m in ms}
    for got, want in zip(step(), expected, strict=True):  # served as decided, results right
        assert (got - want).abs().max().item() < 1e-4
    served = {k.text: d.variant for k, d in runtime.decisions().items()}
    stored = _stored(url)
    for m in ms:
        (check,) = [c for c in report.checks if c.key == _key(m)]
        assert check.gain == pytest.approx(1 + per_key, rel=1e-3)  # its own gain in the step
        status, _ = in_step_of(stored[_key(m)].env)
        if together:
            assert (check.status, check.served, check.joint) == (
                "kept",
                NearMiss.name,
                pytest.approx(1 + 3 * per_key),
            )
            assert served[_key(m)] == NearMiss.name and stored[_key(m)].variant == NearMiss.name
            assert status == "kept" and float(stored[_key(m)].env[IN_STEP_JOINT]) == pytest.approx(
                1 + 3 * per_key
            )
            assert IN_STEP_WINNER not in stored[_key(m)].env
            assert "together" in in_step_text(stored[_key(m)])
        else:
            assert (check.status, check.served, check.joint) == ("replaced", "bsp", None)
            assert served[_key(m)] == "bsp" and stored[_key(m)].variant == "bsp"
            assert status == "replaced" and IN_STEP_JOINT not in stored[_key(m)].env
    CALLS.clear()
    IN_STEP["on"] = True
    try:
        step()
    finally:
        IN_STEP["on"] = False
    assert CALLS == ([NearMiss.name] if together else ["bsp"]) * len(ms)


def test_only_keys_turned_down_to_bsp_with_a_gain_above_one_are_near_misses() -> None:
    from autotaxer.tuner.in_step import Verdict
    from autotaxer.tuner.in_step_joint import near_misses

    def verdict(status: str, to_bsp: bool, winner_gain: float) -> Verdict:
        return Verdict(status, 1 if to_bsp else 0, 1.0, 0.0, 1.0, 1.0, (), winner_gain, to_bsp)

    checked = [
        (0, "g", "kept", verdict("kept", False, 1.2)),
        (1, "g", "near", verdict("replaced", True, 1.004)),
        (2, "g", "slower", verdict("replaced", True, 0.97)),
        (3, "g", "form", verdict("replaced", False, 1.004)),  # another form served: not bsp
    ]
    assert [c[2] for c in near_misses(checked)] == ["near"]
