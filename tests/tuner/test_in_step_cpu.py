"""Warm-up's in-step check on 2 gloo ranks (CPU): a winner that makes the step slower is not served, one
that speeds it up is kept, with the gain in the step stored; a fastest form other than plain BSP (torch's
fused op, say) that slows the step is served neither as the winner nor in a winner's place: plain BSP is;
winners with no check (``check_rounds=0``) are marked unchecked and the next launch checks them;
``autotaxer show`` prints the gain.

The planted winners compute what BSP computes, and BSP (the only form on CPU) is made slower by
:data:`FORM_DELAY_S` a call, so each planted variant wins its isolated trials. One of them is slower
still, but only inside the step (:data:`STEP_DELAY_S`), as a kernel that holds what its neighbours need
is: its isolated trials cannot see it, the check in the step does. A planted form users would have
without autotaxer (:class:`FormSlowsStep`, as torch's fused op) beats BSP in isolation and slows the step.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest
from _factories import make_record

from autotaxer.ops.ag_gemm.bsp import BspVariant
from autotaxer.testing import run_ranks

#: What BSP costs more than the planted winners, per call (seconds).
FORM_DELAY_S = 0.03
#: What the step-slowing winner costs inside the step, per call (seconds).
STEP_DELAY_S = 0.08
#: Whether a test step is running (read by the step-slowing winner).
IN_STEP = {"on": False}
QUIET = {"shipped_tables": False, "env_tables": False, "persist_misses": False}
N = K = 8


class SpeedsUp(BspVariant):
    """BSP's computation, planted at one M: in isolation and in the step it beats the delayed BSP."""

    name = "planted_speeds_up"
    is_baseline = False
    device_types = frozenset({"cpu"})
    at_m: tuple[int, ...] = (32, 48, 64, 96)

    def check(self, key, target, params) -> str | None:
        return None if key["M"] in self.at_m else f"M: {self.name} is planted at M={self.at_m}"


class SlowsStep(SpeedsUp):
    """As :class:`SpeedsUp`, but slower than BSP inside the step."""

    name = "planted_slows_step"
    at_m = (16,)

    def run(self, ws, inputs, ctx, out=None) -> Any:
        if IN_STEP["on"]:
            time.sleep(STEP_DELAY_S)
        return super().run(ws, inputs, ctx, out)


class FormSlowsStep(BspVariant):
    """A form users have without autotaxer (``fallback_form``, as torch's fused op), at every M: faster than
    BSP in isolation (half its delay), slower inside the step."""

    name = "planted_form"
    is_baseline = False
    fallback_form = True
    device_types = frozenset({"cpu"})

    def run(self, ws, inputs, ctx, out=None) -> Any:
        time.sleep(STEP_DELAY_S if IN_STEP["on"] else FORM_DELAY_S / 2)
        return super().run(ws, inputs, ctx, out)


def _plant() -> None:
    from autotaxer.ops import get_op

    op = get_op("ag_gemm")
    for variant in (SpeedsUp(), SlowsStep(), FormSlowsStep()):
        op.register(variant)
    bsp = op.variants["bsp"]
    plain = bsp.run

    def delayed(ws, inputs, ctx, out=None):
        time.sleep(FORM_DELAY_S)
        return plain(ws, inputs, ctx, out)

    bsp.run = delayed


def _step(ws: int, rank: int, ms: tuple[int, ...], sleep_s: float = 0.0):
    import torch

    import autotaxer

    gen = torch.Generator().manual_seed(1)
    b = torch.randn(K, N, generator=gen)
    shards = [torch.randn(m, K, generator=gen).chunk(ws)[rank].contiguous() for m in ms]

    def step() -> None:
        IN_STEP["on"] = True
        try:
            for a in shards:
                autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
            time.sleep(sleep_s)  # the rest of a long step
        finally:
            IN_STEP["on"] = False

    return step


def _key(m: int, ws: int = 2) -> str:
    return f"ag_gemm|cpu|{ws}|fp32|M={m},N={N},K={K}|gather_dim=0"


def _served() -> dict:
    from autotaxer.runtime.dispatch import get_runtime

    return {k.text: [d.variant, d.source] for k, d in get_runtime().decisions().items()}


def _winners(url: str) -> dict:
    from autotaxer.storage import open_database

    with open_database(url) as db:
        return {w.key.text: [w.variant, dict(w.env), w.speedup] for w in db.winners()}


def _ranks(ctx, tmp: str) -> dict:
    import torch

    import autotaxer

    _plant()
    ws, rank = ctx.world_size, ctx.rank
    url = f"sqlite:///{tmp}/in_step.sqlite"
    config = autotaxer.RuntimeConfig(db_url=url, **QUIET)
    variants = ("planted_speeds_up", "planted_slows_step")
    out: dict = {}
    # 1. two winners and a form that wins alone, checked one at a time in a step that calls the three keys
    autotaxer.init(config)
    step = _step(ws, rank, (16, 32, 80))
    report = autotaxer.warmup(
        step, budget_s=120, trials=6, variants=(*variants, "planted_form"), seed_nearby=False, progress=False
    )
    step()
    out["checked"] = {"report": report, "served": _served(), "db": _winners(url) if rank == 0 else None}
    # 2. no check: the winner is served unchecked; the next launch on the database checks it
    autotaxer.init(config)
    step48 = _step(ws, rank, (48,))
    report = autotaxer.warmup(
        step48, budget_s=120, trials=2, variants=variants, seed_nearby=False, progress=False, check_rounds=0
    )
    step48()
    out["off"] = {"report": report, "served": _served(), "db": _winners(url) if rank == 0 else None}
    autotaxer.init(config)  # a new launch's runtime
    report = autotaxer.warmup(step48, budget_s=120, variants=variants, progress=False)
    step48()
    out["next"] = {"report": report, "served": _served(), "db": _winners(url) if rank == 0 else None}
    # 3. a budget tuning leaves too little of for checking a long step (4 * 5 + 2 steps of 1 s): unchecked
    autotaxer.init(config)
    step64 = _step(ws, rank, (64,), sleep_s=1.0)
    report = autotaxer.warmup(
        step64, budget_s=14, trials=2, variants=variants, seed_nearby=False, progress=False
    )
    step64()
    out["short"] = {"report": report, "served": _served(), "db": _winners(url) if rank == 0 else None}
    # 4. scenario 1 compiled (a database of its own): the check switches the keys inside the graph
    out["compiled"] = _compiled(ws, rank, f"sqlite:///{tmp}/compiled.sqlite", variants)
    # 5. a winner as `autotaxer tune` stores it (no in-step stamp) in the warm-up's database: checked
    autotaxer.init(config)
    step96 = _step(ws, rank, (96,))
    autotaxer.warmup(
        step96, budget_s=120, trials=2, variants=variants, seed_nearby=False, progress=False, check_rounds=0
    )
    if rank == 0:
        _unstamp(url, _key(96))
    torch.distributed.barrier()
    autotaxer.init(config)
    before = _winners(url) if rank == 0 else None
    report = autotaxer.warmup(step96, budget_s=120, variants=variants, progress=False)
    step96()
    after = _winners(url) if rank == 0 else None
    out["cli"] = {"before": before, "report": report, "served": _served(), "db": after}
    return out


def _unstamp(url: str, key: str) -> None:
    """Store ``key``'s record again without warm-up's stamps, as ``autotaxer tune`` leaves a record."""
    import dataclasses

    from autotaxer.records import IN_STEP
    from autotaxer.storage import open_database

    with open_database(url) as db:
        (rec,) = [w for w in db.winners() if w.key.text == key]
        env = {k: v for k, v in rec.env.items() if k != IN_STEP}
        db.upsert_winners([dataclasses.replace(rec, env=env)], replace=True)


def _compiled(ws: int, rank: int, url: str, variants: tuple[str, ...]) -> dict:
    import torch

    import autotaxer

    autotaxer.init(autotaxer.RuntimeConfig(db_url=url, **QUIET))
    gen = torch.Generator().manual_seed(2)
    b = torch.randn(K, N, generator=gen)
    full = [torch.randn(m, K, generator=gen) for m in (16, 32)]
    shards = [a.chunk(ws)[rank].contiguous() for a in full]

    def body(x, y, w):
        return torch.cat(
            [
                autotaxer.dispatch("ag_gemm", x, w, gather_dim=0),
                autotaxer.dispatch("ag_gemm", y, w, gather_dim=0),
            ]
        )

    compiled = torch.compile(body, backend="aot_eager", fullgraph=True)

    def step():
        IN_STEP["on"] = True
        try:
            return compiled(*shards, b)
        finally:
            IN_STEP["on"] = False

    step()
    report = autotaxer.warmup(
        step, budget_s=120, trials=2, variants=variants, seed_nearby=False, progress=False
    )
    error = (step() - torch.cat([a @ b for a in full])).abs().max().item()
    return {"report": report, "served": _served(), "error": error}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("in_step")
    env = {"AUTOTAXER_DB": f"sqlite:///{tmp}/default.sqlite", "XDG_DATA_HOME": str(tmp)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # inherited by the spawned ranks: nothing reaches the user's database
    try:
        return run_ranks(_ranks, 2, "cpu", args=(str(tmp),), timeout=300)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _check(report, key: str):
    (check,) = [c for c in report.checks if c.key == key]
    return check


def test_a_winner_that_slows_the_step_is_not_served_and_its_record_says_why(ranks) -> None:
    key = _key(16)
    first = ranks[0]["checked"]
    (result,) = [r for r in first["report"].results if r.key == key]
    assert result.status == "tuned" and result.variant == "planted_slows_step"  # it won in isolation
    assert result.speedup > 1
    assert all(r["checked"]["served"][key] == ["bsp", "exact"] for r in ranks)  # on every rank
    variant, env, _ = first["db"][key]
    assert variant == "bsp" and env["in_step"] == "replaced" and env["in_step_winner"] == "planted_slows_step"
    assert float(env["in_step_gain"]) < 1
    check = _check(first["report"], key)
    assert (check.status, check.winner, check.form) == ("replaced", "planted_slows_step", "bsp")
    assert check.gain < 1 and first["report"].served(key) == "bsp"


def test_a_winner_that_speeds_the_step_up_stays_served_with_its_gain_stored(ranks) -> None:
    key = _key(32)
    first = ranks[0]["checked"]
    assert all(r["checked"]["served"][key] == ["planted_speeds_up", "exact"] for r in ranks)
    variant, env, speedup = first["db"][key]
    assert variant == "planted_speeds_up" and env["in_step"] == "kept" and speedup > 1
    check = _check(first["report"], key)
    assert (check.status, check.served, check.form) == ("kept", "planted_speeds_up", "bsp")  # gain over bsp
    assert check.gain > 1 + check.noise
    assert float(env["in_step_gain"]) == pytest.approx(check.gain, rel=1e-3)


def test_a_fastest_form_that_slows_the_step_is_not_served_in_a_winners_place(ranks) -> None:
    """The winner at M=16 slows the step, and so does its fastest form (the planted one, faster than BSP
    alone): plain BSP serves the key, not the form."""
    key = _key(16)
    first = ranks[0]["checked"]
    variant, env, _ = first["db"][key]
    assert env["fastest_form_isolated"] == "planted_form"  # the form the check used to fall back to
    assert variant == "bsp" and first["report"].served(key) == "bsp"


def test_the_fastest_form_a_record_names_is_the_steps(ranks) -> None:
    """What dispatch serves untuned keys near a checked one (``env["fastest_form"]``) is the form that was
    fastest in the step: the planted form lost it at every key, so ``bsp``, kept winner or not."""
    db = ranks[0]["checked"]["db"]
    for m in (16, 32, 80):
        _, env, _ = db[_key(m)]
        assert (env["fastest_form"], env["fastest_form_isolated"]) == ("bsp", "planted_form"), m


def test_a_form_that_won_alone_is_checked_against_bsp_in_the_step(ranks) -> None:
    """At M=80 the planted form is the isolated winner (no planted winner runs there): a form users have
    without autotaxer is checked against plain BSP as any winner is, and replaced when it slows the step."""
    key = _key(80)
    first = ranks[0]["checked"]
    (result,) = [r for r in first["report"].results if r.key == key]
    assert (result.status, result.variant) == ("tuned", "planted_form")
    check = _check(first["report"], key)
    assert (check.status, check.winner, check.form) == ("replaced", "planted_form", "bsp")
    assert all(r["checked"]["served"][key] == ["bsp", "exact"] for r in ranks)
    variant, env, _ = first["db"][key]
    assert variant == "bsp" and env["in_step_winner"] == "planted_form"


def test_a_compiled_step_is_checked_as_it_runs_compiled(ranks) -> None:
    compiled = ranks[0]["compiled"]
    assert {c.key: c.status for c in compiled["report"].checks} == {_key(16): "replaced", _key(32): "kept"}
    assert compiled["served"] == {_key(16): ["bsp", "exact"], _key(32): ["planted_speeds_up", "exact"]}
    assert max(r["compiled"]["error"] for r in ranks) < 1e-4  # traced again after the switch, still right


def test_ranks_agree_on_every_check(ranks) -> None:
    for scenario in ("checked", "off", "next", "short", "compiled", "cli"):
        assert ranks[1][scenario]["report"].checks == ranks[0][scenario]["report"].checks
        assert ranks[1][scenario]["served"] == ranks[0][scenario]["served"]


def test_unchecked_winners_are_marked_and_checked_by_the_next_launch(ranks) -> None:
    key = _key(48)
    off, nxt = ranks[0]["off"], ranks[0]["next"]
    check = _check(off["report"], key)
    assert (check.status, check.served, check.gain) == ("unchecked", "planted_speeds_up", None)
    assert "check_rounds=0" in check.note
    assert off["served"][key] == ["planted_speeds_up", "exact"]
    assert off["db"][key][1]["in_step"] == "unchecked" and "in_step_gain" not in off["db"][key][1]
    assert nxt["report"].results == ()  # nothing tuned again
    check = _check(nxt["report"], key)
    assert check.status == "kept" and nxt["db"][key][1]["in_step"] == "kept"


def test_winners_autotaxer_tune_stored_in_the_warm_ups_database_are_checked_in_the_step(ranks) -> None:
    key = _key(96)
    cli = ranks[0]["cli"]
    assert cli["before"][key][0] == "planted_speeds_up" and "in_step" not in cli["before"][key][1]
    assert cli["report"].results == ()  # tuned already: checked, not tuned again
    check = _check(cli["report"], key)
    assert check.status == "kept" and check.gain is not None and check.gain > 1
    assert cli["db"][key][1]["in_step"] == "kept" and cli["served"][key] == ["planted_speeds_up", "exact"]


def test_winners_the_budget_leaves_no_time_to_check_stay_served_marked_unchecked(ranks) -> None:
    key = _key(64)
    short = ranks[0]["short"]
    (result,) = short["report"].results
    assert (result.key, result.status, result.variant) == (key, "tuned", "planted_speeds_up")
    check = _check(short["report"], key)
    assert (check.status, check.note, check.served) == ("unchecked", "budget spent", "planted_speeds_up")
    assert short["db"][key][0] == "planted_speeds_up" and short["db"][key][1]["in_step"] == "unchecked"
    assert short["report"].tuning_s + short["report"].check_s < 14  # within the budget


# -- the rule and the budget, without ranks ----------------------------------------------------------
def test_an_arm_must_beat_bsp_in_paired_rounds_by_more_than_noise_and_one_percent() -> None:
    from autotaxer.tuner.in_step import _verdict

    # per rank, per arm (winner, form, bsp), the step's seconds in each of 5 rounds; the slowest rank counts
    bsp = [0.100, 0.104, 0.098, 0.101, 0.100]
    winner = [0.090, 0.093, 0.089, 0.091, 0.090]
    form = [0.095, 0.099, 0.094, 0.096, 0.095]
    fast_rank1 = [w - 0.005 for w in winner]
    clear = _verdict([[winner, form, bsp], [fast_rank1, form, bsp]])
    assert (clear.status, clear.served) == ("kept", 0)
    assert clear.gain == pytest.approx(statistics.median(b / w for b, w in zip(bsp, winner, strict=True)))
    assert clear.winner_s == pytest.approx(0.090) and clear.form_s == pytest.approx(0.100)
    assert 0 <= clear.noise < clear.gain - 1
    # the form beats bsp, the winner does not: the form is served in its place
    slow = [b * 1.02 for b in bsp]
    by_form = _verdict([[slow, form, bsp]])
    assert (by_form.status, by_form.served) == ("replaced", 1) and by_form.gain < 1
    # neither beats bsp: bsp is served (the last arm), even where the fastest form is not bsp
    assert _verdict([[slow, [b * 1.05 for b in bsp], bsp]]).served == 2
    # 10% faster in the median, but one round of five slower than bsp: not faster with 95% confidence
    jumpy = [0.090, 0.091, 0.089, 0.120, 0.090]
    assert _verdict([[jumpy, bsp]]).status == "replaced"
    close = [b * 0.995 for b in bsp]  # 0.5% faster in every round: below the 1% floor
    assert _verdict([[close, bsp]]).status == "replaced"
    assert _verdict([]) is None


def test_the_lower_bound_is_an_order_statistic_of_the_median() -> None:
    from autotaxer.tuner.in_step import lower_bound

    values = list(range(1, 16))  # 15 values: P(Bin(15, 1/2) <= 3) = 1.8% <= 5% < P(<= 4) = 5.9%
    assert lower_bound(values) == 4
    assert lower_bound([3, 1, 2, 5, 4]) == 1  # 5 values: only the smallest has 95% confidence
    assert lower_bound([2.0, 1.0]) == 1.0  # too few: the smallest


def test_more_rounds_run_while_the_time_left_covers_them() -> None:
    from autotaxer.tuner.in_step import MAX_ROUNDS_FACTOR, rounds_to_run, steps_per_key

    assert rounds_to_run(5, 1000.0, 2, 0.01) == 5 * MAX_ROUNDS_FACTOR  # a cheap step: three times as many
    assert rounds_to_run(5, 0.0, 2, 0.01) == 5  # never fewer than asked
    assert rounds_to_run(0, 1000.0, 2, 0.01) == 0  # the check is off
    some = rounds_to_run(5, 2 * 2 * steps_per_key(7) * 0.1, 2, 0.1)
    assert some == 7  # half the time left, shared by the keys


def test_a_checks_progress_line_names_winner_gain_times_and_verdict() -> None:
    from autotaxer.tuner.in_step import StepCheck

    key = "ag_gemm|nvidia-h200|2|bf16|M=256,N=8192,K=8192|gather_dim=0,b_layout=nk"
    lost = StepCheck(key, "push", "bsp", "replaced", 0.93, 0.012, 1.29, 1.2)
    assert lost.line(1, 2) == (
        "  [1/2] ag_gemm bf16 M=256 N=8192 K=8192 gd=0 nk: push 0.93× the step with bsp "
        "(1.29 vs 1.2 ms, noise 1.2%): served bsp instead"
    )
    adopted = StepCheck(key, "push", "bsp", "kept", 1.1, note="checked by another group or process")
    assert adopted.line(2, 2).endswith(
        "push 1.10× the step with bsp (checked by another group or process): kept"
    )
    unchecked = StepCheck(key, "push", "bsp", "unchecked", note="budget spent")
    assert unchecked.line(2, 2).endswith("push not checked in the step (budget spent); served unchecked")
    assert (lost.served, adopted.served, unchecked.served) == ("bsp", "push", "push")


def test_the_budget_holds_back_at_most_a_quarter_for_the_check() -> None:
    from autotaxer.tuner.in_step import reserve_s, steps_per_key

    assert reserve_s(100.0, 2, 0.1, 5) == pytest.approx(2 * (steps_per_key(5) + 2) * 0.1)
    assert reserve_s(100.0, 50, 1.0, 5) == 25.0
    assert reserve_s(100.0, 2, 0.1, 0) == 0.0  # no check, nothing held back


def test_show_prints_the_in_step_gain_beside_the_speedup(tmp_path) -> None:
    import dataclasses
    import json

    from typer.testing import CliRunner

    from autotaxer.cli import app
    from autotaxer.storage import open_database

    def stamped(rec, **env):
        return dataclasses.replace(rec, env={**rec.env, **env})

    kept = stamped(
        make_record(16, median_us=20.0, bsp_us=30.0),
        in_step="kept",
        in_step_gain="1.0830",
        confirmed="interleaved",
    )
    replaced = stamped(
        make_record(32, median_us=30.0, bsp_us=30.0, variant="bsp"),
        in_step="replaced", in_step_gain="0.9312", in_step_winner="push",
    )  # fmt: skip
    unchecked = stamped(make_record(64), in_step="unchecked")
    url = f"sqlite:///{tmp_path}/show.sqlite"
    with open_database(url) as db:
        db.upsert_winners([kept, replaced, unchecked, make_record(128)])
    runner = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "250"})
    compact = runner.invoke(app, ["show", "--db", url])
    assert compact.exit_code == 0, compact.output
    lines = {m: next(ln for ln in compact.output.splitlines() if f"M={m} " in ln) for m in (16, 32, 64, 128)}
    assert "1.50×" in lines[16] and "1.08×" in lines[16]  # beside the isolated speedup
    assert "push 0.93×" in lines[32] and "unchecked" in lines[64]
    assert lines[128].rstrip().endswith("-")
    wide = runner.invoke(app, ["show", "--db", url, "--wide"])
    assert wide.exit_code == 0 and "in-step" in wide.output and "push 0.93×" in wide.output
    rows = json.loads(runner.invoke(app, ["show", "--db", url, "--format", "json"]).output)
    got = {r["shape"]["M"]: (r["in_step"], r["in_step_gain"]) for r in rows}
    assert got == {16: ("kept", 1.083), 32: ("replaced", 0.9312), 64: ("unchecked", None), 128: (None, None)}


@pytest.mark.parametrize(
    ("verdict", "resumed"), [(None, True), ("unchecked", True), ("kept", False), ("replaced", False)]
)
def test_a_later_warm_up_does_not_resume_a_search_the_step_has_decided(verdict, resumed) -> None:
    """A key whose search was cut short is resumed by the next warm-up, unless the in-step check decided it:
    resuming would store the isolated winner over the verdict (seen on 2xH200, where a second mode's warm-up
    resumed the keys the first had replaced and served their winners unchecked)."""
    import dataclasses
    from types import SimpleNamespace

    from autotaxer.tuner.warmup import _to_tune

    url = "sqlite:///t.sqlite"
    env = {"search": "partial", **({"in_step": verdict} if verdict else {})}
    rec = dataclasses.replace(make_record(16), env={**make_record(16).env, **env})
    rt = SimpleNamespace(
        decide_key=lambda key: SimpleNamespace(is_miss=False),
        table=SimpleNamespace(records={rec.key: rec}, origins={rec.key: url}),
        config=SimpleNamespace(tuning_db_url=lambda: url, timing=None),
    )
    assert _to_tune(rt, rec.key) is resumed


@pytest.mark.parametrize(("timing", "resumed"), [(None, True), ("eager", True), ("graph", False)])
def test_a_warm_up_resumes_a_search_only_in_the_timing_it_was_cut_short_in(timing, resumed) -> None:
    """An eager search cut short is resumed by an eager warm-up, not by one timing CUDA-graph replays (a
    study holds one timing: its medians would not compare); the key is served as before."""
    import dataclasses
    from types import SimpleNamespace

    from autotaxer.tuner.warmup import _to_tune

    url = "sqlite:///t.sqlite"
    rec = dataclasses.replace(
        make_record(16), env={**make_record(16).env, "search": "partial", "timing": "eager"}
    )
    rt = SimpleNamespace(
        decide_key=lambda key: SimpleNamespace(is_miss=False),
        table=SimpleNamespace(records={rec.key: rec}, origins={rec.key: url}),
        config=SimpleNamespace(tuning_db_url=lambda: url, timing=None),
    )
    assert _to_tune(rt, rec.key, timing) is resumed


def test_each_form_runs_two_untimed_steps_before_its_first_timed_one(monkeypatch) -> None:
    """A CUDA-graph replayed winner's first call after it is served is eager and its second captures
    (:mod:`autotaxer.runtime.replay`): the first round runs two untimed steps per form before timing one,
    the later rounds one, and :func:`steps_per_key` counts them (the budget's estimate)."""
    import types

    import autotaxer.tuner.in_step as in_step

    serving: list[str] = []
    log: list[tuple[str, bool]] = []  # (form served, timed)
    timing = [False]

    class Runtime:
        def serve_decision(self, key, decision):
            serving.append(decision)

    def step():
        log.append((serving[-1], timing[0]))

    original = in_step._timed

    def timed(step_fn, args, world):
        timing[0] = True
        try:
            return original(step_fn, args, world)
        finally:
            timing[0] = False

    monkeypatch.setattr(in_step, "_timed", timed)
    mine = (Runtime(), types.SimpleNamespace(key="k"))
    samples = in_step._rounds(step, (), 3, 0, mine, ("win", "form", "bsp"), 3, in_step._World())
    assert [len(s) for s in samples] == [3, 3, 3]
    assert len(log) == in_step.steps_per_key(3, arms=3)
    for form in ("win", "form", "bsp"):
        flags = [timed for served, timed in log if served == form]
        assert flags[:3] == [False, False, True]  # two untimed steps, then the first timed one
        assert flags[3:] == [False, True, False, True]


def test_with_check_graphs_each_arm_is_captured_once_and_timed_as_replays(monkeypatch) -> None:
    """``check_graphs=True``: each arm runs its two eager steps, is captured once (a stand-in graph here:
    CPUs have none), and every later step of that arm, timed or not, replays its own graph; every graph
    is destroyed when the rounds end (a graph that captured a collective holds ``destroy_process_group``)."""
    import types

    import autotaxer.tuner.in_step as in_step

    serving: list[str] = []
    log: list[tuple[str, str]] = []  # (arm, what ran: eager / capture / replay)

    class Runtime:
        def serve_decision(self, key, decision):
            serving.append(decision)

    def step():
        log.append((serving[-1], "eager"))

    class Graph:
        def __init__(self, arm):
            self.arm = arm

        def reset(self):
            log.append((self.arm, "reset"))

    def capture(step_fn, args, captured):
        arm = serving[-1]
        log.append((arm, "capture"))
        captured.append(Graph(arm))
        return lambda: log.append((arm, "replay"))

    monkeypatch.setattr(in_step, "_capture", capture)
    mine = (Runtime(), types.SimpleNamespace(key="k"))
    samples = in_step._rounds(step, (), 3, 0, mine, ("win", "bsp"), 2, in_step._World(), graphs=True)
    assert [len(s) for s in samples] == [3, 3]
    for arm in ("win", "bsp"):
        ran = [what for a, what in log if a == arm]
        assert ran == ["eager", "eager", "capture", "replay", "replay", "replay", "replay", "replay", "reset"]


@pytest.mark.parametrize("graphs", [True, False])
def test_graph_timed_steps_launch_every_call_eagerly_and_eager_timed_ones_replay(monkeypatch, graphs) -> None:
    """With ``check_graphs`` the step's own graph is what is timed: every step of the rounds (and its
    capture) runs while :func:`autotaxer.runtime.replay.eager_calls` holds, so no variant's graph is
    replayed in between; without, the steps run as the model's do (replayed variants replayed), and the
    hold is released after the rounds either way."""
    import types

    import autotaxer.tuner.in_step as in_step
    from autotaxer.runtime import replay

    held: list[int] = []

    class Runtime:
        def serve_decision(self, key, decision):
            pass

    def step():
        held.append(replay._EAGER_HOLDS)

    class Graph:
        def reset(self):
            pass

    def capture(step_fn, args, captured):
        captured.append(Graph())
        step_fn(*args)
        return step

    monkeypatch.setattr(in_step, "_capture", capture)
    mine = (Runtime(), types.SimpleNamespace(key="k"))
    in_step._rounds(step, (), 2, 0, mine, ("win", "bsp"), 2, in_step._World(), graphs=graphs)
    # per arm: two eager steps, (the capture,) a timed step, then an untimed and a timed one
    assert len(held) == 2 * (6 if graphs else 5)
    assert set(held) == ({1} if graphs else {0})
    assert replay._EAGER_HOLDS == 0


def test_check_graphs_destroys_its_graphs_when_a_step_fails(monkeypatch) -> None:
    """A step that raises mid-rounds: its graphs are released and its error (not the release's) raised."""
    import types

    import autotaxer.tuner.in_step as in_step

    reset: list[int] = []
    calls = [0]

    class Graph:
        def reset(self):
            reset.append(1)
            raise RuntimeError("CUDA error: sticky")  # dropped: the step's own error is the one raised

    def capture(step_fn, args, captured):
        captured.append(Graph())
        return step_fn

    def step():
        calls[0] += 1
        if calls[0] > 5:
            raise RuntimeError("peer gone")

    class Runtime:
        def serve_decision(self, key, decision):
            pass

    monkeypatch.setattr(in_step, "_capture", capture)
    mine = (Runtime(), types.SimpleNamespace(key="k"))
    with pytest.raises(RuntimeError, match="peer gone"):
        in_step._rounds(step, (), 3, 0, mine, ("win", "bsp"), 2, in_step._World(), graphs=True)
    assert len(reset) == 2  # both arms' graphs, captured before the failure, each released


def test_check_graphs_without_cuda_is_refused_before_the_step_runs(monkeypatch) -> None:
    import autotaxer
    import autotaxer.tuner.warmup as warmup

    monkeypatch.setattr(warmup, "_cuda", lambda: False)
    ran = []
    with pytest.raises(ValueError, match="check_graphs"):
        autotaxer.warmup(lambda: ran.append(1), budget_s=1, check_graphs=True, progress=False)
    assert ran == []


def test_where_no_arm_beats_bsp_the_fastest_form_is_served_unless_it_slows_the_step() -> None:
    """The step cannot tell the fastest form (faster per op) from ``bsp``: it is served, not ``bsp``, as long
    as its median step is not slower; a form that slows the step, or no tie arm, leaves ``bsp``."""
    from autotaxer.tuner.in_step import _verdict

    bsp = [0.100, 0.104, 0.098, 0.101, 0.100]
    slow = [b * 1.02 for b in bsp]  # the winner slows the step
    even = [b * 0.998 for b in bsp]  # the form: 0.2% faster, below the 1% floor
    tied = _verdict([[slow, even, bsp]], tie=1)
    assert (tied.status, tied.served, tied.to_bsp) == ("replaced", 1, False)
    assert _verdict([[slow, even, bsp]]).served == 2  # no tie arm: bsp
    assert _verdict([[slow, [b * 1.003 for b in bsp], bsp]], tie=1).served == 2  # slower than bsp: bsp
    # the winner is itself the fastest form and ties with bsp: kept
    assert (_verdict([[even, bsp]], tie=0).status, _verdict([[even, bsp]], tie=0).served) == ("kept", 0)
    # an arm that passes still wins over the tie
    fast = [b * 0.95 for b in bsp]
    assert _verdict([[fast, even, bsp]], tie=1).served == 0


def test_the_tie_arm_is_the_fastest_form_measured_alone_among_the_arms() -> None:
    from types import SimpleNamespace

    from autotaxer._problem import ProblemKey
    from autotaxer.tuner.in_step import tie_arm

    key = ProblemKey.from_text("ag_gemm|nvidia-h200|2|bf16|M=8192,N=5120,K=8192|gather_dim=0,b_layout=nk")
    arms = [SimpleNamespace(variant=v) for v in ("copy_engine", "torch_fused", "bsp")]
    rec = SimpleNamespace(key=key, variant="copy_engine", env={"fastest_form": "torch_fused"})
    assert tie_arm(rec, arms) == 1
    assert tie_arm(SimpleNamespace(key=key, variant="copy_engine", env={"fastest_form": "bsp"}), arms) is None
    winner_form = SimpleNamespace(key=key, variant="torch_fused", env={})
    assert tie_arm(winner_form, [SimpleNamespace(variant="torch_fused"), SimpleNamespace(variant="bsp")]) == 0
    assert tie_arm(SimpleNamespace(key=key, variant="copy_engine", env={}), arms[::2]) is None


def test_a_wait_on_a_peer_that_gives_up_during_the_rounds_stops_the_check(monkeypatch) -> None:
    """A step replayed from a CUDA graph never reaches dispatch's poll: after each timed step the check
    looks for waits that gave up (on every rank) and stops, its graphs released, naming the site; it does
    not go on timing steps whose every wait times out."""
    import types

    import autotaxer.ops._peer_wait as peer_wait
    import autotaxer.tuner.in_step as in_step

    site = peer_wait.Site("ag_gemm", "copy_engine", "k", 0, 2)
    failure = peer_wait.PeerFailure(site, 5.0, 1, 1, 3, 7, 6)
    looks = [0]

    def check(device=None):
        looks[0] += 1
        if looks[0] == 2:
            raise peer_wait.PeerTimeoutError(failure)

    monkeypatch.setattr(peer_wait, "check", check)
    serving: list[str] = []
    released: list[str] = []

    class Runtime:
        def serve_decision(self, key, decision):
            serving.append(decision)

    class Graph:
        def __init__(self, arm):
            self.arm = arm

        def reset(self):
            released.append(self.arm)

    def capture(step_fn, args, captured):
        captured.append(Graph(serving[-1]))
        return lambda: None

    monkeypatch.setattr(in_step, "_capture", capture)
    mine = (Runtime(), types.SimpleNamespace(key="k"))
    with pytest.raises(in_step.StepWaitGaveUp, match="copy_engine at k: rank 0 of 2 waited 5 s for rank 1"):
        in_step._rounds(lambda: None, (), 5, 0, mine, ("win", "bsp"), 2, in_step._World(), graphs=True)
    assert looks[0] == 2 and sorted(released) == ["bsp", "win"]  # stopped at once, every graph released


def test_a_keys_verdict_is_stored_before_the_next_key_reads_whether_another_group_checked_it(monkeypatch):
    """Two groups meeting one key (one schedule entry each): the first group's verdict is written by its
    rank 0 at the end of its entry, and the second group's rank 0 reads the database at the start of its
    own. A barrier between them orders the write before the read on every rank; without it the second
    group could miss the verdict, check the key again and serve another one (a flaky CI run,
    2026-11-29)."""
    import types

    import autotaxer.tuner.in_step as in_step

    log: list[str] = []

    class World:
        rank = 0

        def gather(self, obj):
            return [obj]

        def barrier(self):
            log.append("barrier")

    class Runtime:
        def __init__(self, group):
            self.group, self.ctx = group, types.SimpleNamespace(rank=0)

        def traced(self, key):
            return False

    key = types.SimpleNamespace(text="ag_gemm|k")
    rec = types.SimpleNamespace(key=key)
    monkeypatch.setattr(in_step, "_World", World)
    monkeypatch.setattr(in_step, "group_name", lambda group: group)
    monkeypatch.setattr(in_step, "checkable", lambda rt, k: rec)
    arms = [types.SimpleNamespace(variant=v) for v in ("win", "bsp")]
    monkeypatch.setattr(in_step, "arms_of", lambda rt, r: arms)
    monkeypatch.setattr(in_step, "_timed", lambda step, args, world: 0.001)
    monkeypatch.setattr(in_step, "_rounds", lambda *args: [[1.0] * 3, [1.0] * 3])
    monkeypatch.setattr(in_step, "_forms_us", lambda *args: {})
    monkeypatch.setattr(in_step, "tie_arm", lambda *args: None)
    monkeypatch.setattr(in_step, "_checked", lambda mine, *args: mine[0].group)
    monkeypatch.setattr(in_step, "_checked_elsewhere", lambda rt, r: log.append(f"read {rt.group}"))
    monkeypatch.setattr(in_step, "_settle", lambda rt, r, result, *args, **kw: log.append(f"store {result}"))
    candidates = {Runtime("a"): [key], Runtime("b"): [key]}
    in_step.check_in_step(lambda: None, (), candidates, 100.0, 3, progress=False)
    assert log == ["read a", "store a", "barrier", "read b", "store b"]
