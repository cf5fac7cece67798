"""autotaxer.measure on gloo: validation catches wrong outputs, timing is reduced with MAX over ranks."""

from __future__ import annotations

import math
import os
import time

import pytest
from _factories import rank_key

from autotaxer.measure import TimingConfig
from autotaxer.testing import run_ranks


def _check(ctx, variant_name: str, params: dict, gather_dim: int) -> float:
    from autotaxer.measure import check_variant
    from autotaxer.ops import get_op

    op = get_op("ag_gemm")
    key = rank_key(ctx, 8 * ctx.world_size, 12, 4 * ctx.world_size, gather_dim)
    return check_variant(op, op.variants[variant_name], key, params, ctx, seed=3)


def _check_wrong(ctx) -> float:
    """A variant that leaves the bottom half of the output unwritten (NaN) fails the check."""
    from autotaxer.measure import check_variant
    from autotaxer.ops import get_op

    op = get_op("ag_gemm")
    bsp = op.variants["bsp"]

    class HalfWritten(type(bsp)):
        name = "half_written"

        def run(self, ws, inputs, ctx, out=None):
            full = super().run(ws, inputs, ctx)
            out[: out.shape[0] // 2].copy_(full[: out.shape[0] // 2])
            return out

    key = rank_key(ctx, 4 * ctx.world_size, 6, 6, 0)
    return check_variant(op, HalfWritten(), key, {}, ctx, seed=1)


def _time_sleepy(ctx) -> float:
    """Rank 1 sleeps 20 ms per call, rank 0 not at all: every rank must report the slow rank's time."""
    from autotaxer.measure import time_variant

    delay = 0.02 if ctx.rank == 1 else 0.0
    return time_variant(lambda: time.sleep(delay), ctx, warmup=1, iters=2, samples=3)


def _time_graph_on_cpu(ctx) -> str:
    from autotaxer.measure import time_variant

    try:
        time_variant(lambda: None, ctx, warmup=1, iters=1, mode="graph")
    except ValueError as e:
        return str(e)
    return "no error"


def _interleaved(ctx) -> dict:
    """Three entries side by side: a 10 ms call, a 2 ms call (20 ms on rank 1) and one that fails on
    its third call; every call is logged, so the test sees the order the samples ran in."""
    from autotaxer.measure import time_interleaved

    log: list[str] = []

    def call(name: str, delay: float):
        def fn() -> None:
            log.append(name)
            time.sleep(delay)

        return fn

    def failing() -> None:
        log.append("f")
        if log.count("f") > 2:
            raise RuntimeError("boom")

    fns = [call("a", 0.01), call("b", 0.02 if ctx.rank == 1 else 0.002), failing]
    times = time_interleaved(fns, ctx, ("eager",), warmup=1, iters=2, samples=4)
    return {"times": times, "log": "".join(log)}


def _warm_twice(ctx) -> dict:
    """The process warm-up on a fresh context, then again with a budget it must not spend."""
    import torch

    from autotaxer.measure import warm_up

    fresh = ctx.warmed_up
    t0 = time.perf_counter()
    warm_up(ctx, seconds=0.05)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_up(ctx, seconds=60.0)
    again_s = time.perf_counter() - t0
    return {"fresh": fresh, "after": ctx.warmed_up, "first_s": first_s, "again_s": again_s,
            "threads": torch.get_num_threads()}  # fmt: skip


def _everything(ctx) -> dict:
    """All the collective checks in one process group (spawning ranks costs seconds)."""
    return {
        "warm": _warm_twice(ctx),  # first: on a context that has timed nothing yet
        "bsp": [_check(ctx, "bsp", {}, gd) for gd in (0, 1)],
        "wrong": _check_wrong(ctx),
        "sleepy": _time_sleepy(ctx),
        "graph": _time_graph_on_cpu(ctx),
        "interleaved": _interleaved(ctx),
    }


@pytest.fixture(scope="module")
def on_two_ranks() -> list[dict]:
    return run_ranks(_everything, 2, "cpu")


def test_the_process_warm_up_runs_once_per_context(on_two_ranks: list[dict]) -> None:
    for r in on_two_ranks:
        warm = r["warm"]
        assert warm["fresh"] is False and warm["after"] is True
        assert warm["first_s"] >= 0.05 and warm["again_s"] < 60.0  # the second call returned at once


def test_ranks_share_the_cores(on_two_ranks: list[dict]) -> None:
    if os.environ.get("OMP_NUM_THREADS"):
        pytest.skip("OMP_NUM_THREADS sets the pool size")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert [r["warm"]["threads"] for r in on_two_ranks] == [max(1, cores // 2)] * 2


def test_check_variant_accepts_bsp(on_two_ranks: list[dict]) -> None:
    errs = [e for r in on_two_ranks for e in r["bsp"]]
    assert len(errs) == 4 and all(e < 1e-5 for e in errs), errs


def test_check_variant_rejects_unwritten_output(on_two_ranks: list[dict]) -> None:
    assert all(math.isinf(r["wrong"]) for r in on_two_ranks)


def test_time_variant_is_max_over_ranks(on_two_ranks: list[dict]) -> None:
    times = [r["sleepy"] for r in on_two_ranks]
    assert times[0] == times[1]  # one number for the whole group
    assert times[0] >= 20_000  # µs: rank 1's sleep, not rank 0's empty call


def test_time_interleaved_samples_each_once_per_round_in_shuffled_order(on_two_ranks: list[dict]) -> None:
    log = on_two_ranks[0]["interleaved"]["log"]
    assert log[:3] == "abf"  # warm-up: one call each
    # a sample is one untimed lead-in call and two timed ones; the failing entry raises on its third
    # call (its first timed one), so its only sample is 2 calls long and it leaves the rounds
    runs, i = [], 3
    while i < len(log):
        size = 2 if log[i] == "f" else 3
        runs.append(log[i : i + size])
        i += size
    assert runs.count("ff") == 1 and all(r in ("aaa", "bbb", "ff") for r in runs), runs
    rounds = [r[0] for r in runs if r != "ff"]
    assert len(rounds) == 8 and all(set(rounds[i : i + 2]) == {"a", "b"} for i in range(0, 8, 2)), rounds
    assert len({"".join(rounds[i : i + 2]) for i in range(0, 8, 2)}) == 2  # the order changes between rounds


def test_time_interleaved_times_each_entry_max_over_ranks(on_two_ranks: list[dict]) -> None:
    a, b, failed = on_two_ranks[0]["interleaved"]["times"]
    assert on_two_ranks[1]["interleaved"]["times"][:2] == [a, b]  # one number per entry for the group
    assert 10_000 <= a["eager"] < b["eager"]  # b: rank 1's 20 ms, not rank 0's 2 ms
    assert failed["eager"] is None and "RuntimeError: boom" in failed["eager_error"]


def test_graph_timing_needs_cuda(on_two_ranks: list[dict]) -> None:
    msg = on_two_ranks[0]["graph"]
    assert "graph" in msg and "CUDA" in msg


@pytest.mark.parametrize(
    ("field", "cfg"),
    [
        ("mode", TimingConfig(mode="lazy")),
        ("iters", TimingConfig(iters=0)),
        ("samples", TimingConfig(samples=0)),
        ("warmup", TimingConfig(warmup=-1)),
    ],
)
def test_timing_config_names_bad_field(field: str, cfg: TimingConfig) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        cfg.validate()


def test_timing_defaults_per_device() -> None:
    assert TimingConfig.for_device("cpu").iters < TimingConfig.for_device("cuda").iters
    assert TimingConfig.for_device("cuda", "graph").mode == "graph"


# -- chained timing: in this process, on a world of one rank --------------------------------------------
def _one_rank():
    import torch

    from autotaxer._target import cpu_target
    from autotaxer.ops import RunContext

    return RunContext(rank=0, world_size=1, device=torch.device("cpu"), target=cpu_target(), warmed_up=True)


def _logged_links(monkeypatch) -> list:
    """Replace :func:`autotaxer.measure.link` by one that logs ``("link", src pointer, dst pointer)``."""
    from autotaxer import measure

    log: list = []
    real = measure.link

    def logged(src, dst) -> None:
        log.append(("link", src.data_ptr(), dst.data_ptr()))
        real(src, dst)

    monkeypatch.setattr(measure, "link", logged)
    return log


def test_each_timed_call_waits_for_the_previous_calls_output(monkeypatch) -> None:
    """Between two timed calls, one link from the first call's output into the input the calls read; the
    input keeps its exact bits although the outputs hold NaN and inf (an integer add of 0)."""
    import torch

    from autotaxer.measure import Chain, time_variant

    log = _logged_links(monkeypatch)
    feeds = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t()  # not contiguous: a weight's view
    before = feeds.clone()

    def call():
        out = torch.tensor([float("nan"), float("inf"), -float("inf")])  # a fresh output per call
        log.append(("call", out.data_ptr()))
        return out

    us = time_variant(call, _one_rank(), warmup=1, iters=3, samples=2, chain=Chain(feeds))
    assert us > 0
    calls = [i for i, e in enumerate(log) if e[0] == "call"]
    assert len(calls) == 1 + 2 * 3  # warm-up, then two samples of three calls
    for prev, nxt in zip(calls, calls[1:], strict=False):
        between = log[prev + 1 : nxt]
        assert between == [("link", log[prev][1], feeds.data_ptr())], between  # previous output -> feeds
    assert all(e[0] == "link" for e in log[calls[-1] + 1 :])  # then the link alone, timed to subtract it
    assert torch.equal(feeds.view(torch.int16), before.view(torch.int16))


def test_a_call_writing_into_out_is_chained_through_out(monkeypatch) -> None:
    from autotaxer.measure import Chain, time_interleaved

    log = _logged_links(monkeypatch)
    import torch

    feeds, out = torch.ones(4), torch.empty(4)

    def run():
        torch.mul(feeds, 2, out=out)  # returns nothing, like a variant writing into ``out``

    chained, apart = time_interleaved([run, lambda: feeds * 2], _one_rank(), warmup=0, iters=2, samples=2,
                                      chains=[Chain(feeds, out), None])  # fmt: skip
    assert {e[1:] for e in log} == {(out.data_ptr(), feeds.data_ptr())}
    assert chained["eager"] > 0 and chained["eager_link"] > 0  # the link's cost, subtracted, is shown
    assert "eager_link" not in apart and apart["eager"] > 0


def test_back_to_back_calls_are_not_linked(monkeypatch) -> None:
    from autotaxer.measure import time_variant

    log = _logged_links(monkeypatch)
    assert time_variant(lambda: None, _one_rank(), warmup=1, iters=2, samples=2) > 0
    assert log == []


def test_chain_config_names_the_field_and_the_link_is_never_subtracted_past_the_call() -> None:
    from autotaxer.measure import less_link

    with pytest.raises(ValueError, match="^chain:"):
        TimingConfig(chain="b2b").validate()
    assert TimingConfig().chain == "dependent" and TimingConfig.for_device("cpu").chain == "dependent"
    assert less_link(10.0, 4.0) == 6.0 and less_link(3.0, 4.0) == 3.0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_chained_timing_on_a_gpu_keeps_the_inputs_and_times_the_link(mode: str) -> None:
    """On CUDA the link runs on the current stream (captured with the calls in ``graph`` mode): the input
    keeps its bits though the outputs are NaN, and a GEMM's chained time is above zero once the link's
    own time is subtracted."""
    import torch

    from autotaxer._target import cuda_target
    from autotaxer.measure import Chain, time_interleaved
    from autotaxer.ops import RunContext

    ctx = RunContext(rank=0, world_size=1, device=torch.device("cuda", 0), target=cuda_target(0))
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
    before = a.clone()

    def gemm() -> None:
        torch.matmul(a, b, out=out)
        out.view(-1)[:1].fill_(float("nan"))  # not carried into ``a``; no host copy (capturable)

    (t,) = time_interleaved([gemm], ctx, (mode,), warmup=2, iters=10, samples=3, chains=[Chain(a, out)])
    torch.cuda.synchronize()
    assert t.get(f"{mode}_error") is None, t[f"{mode}_error"]
    assert t[mode] > 0 and t[f"{mode}_link"] > 0
    assert torch.equal(a.view(torch.int16), before.view(torch.int16))


@pytest.mark.gpu
def test_graph_timed_calls_returning_fresh_outputs_beside_other_captures_do_not_read_freed_memory() -> None:
    """``autotaxer bench``'s peer (a call returning a fresh tensor, no ``out=``) timed in graph mode beside
    other entries whose captures empty the allocator's cache: every replay reads only what it captured
    (on 2xH200 the link to the previous call's output read a freed tensor: an illegal address)."""
    import torch

    from autotaxer._target import cuda_target
    from autotaxer.measure import Chain, time_interleaved
    from autotaxer.ops import RunContext

    ctx = RunContext(rank=0, world_size=1, device=torch.device("cuda", 0), target=cuda_target(0))
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)
    fresh = lambda: a @ b  # noqa: E731  (a new product each call, as torch's fused op returns)
    into_out = lambda: torch.matmul(a, b, out=out)  # noqa: E731
    times = time_interleaved([fresh, into_out, fresh], ctx, ("graph", "eager"), warmup=2, iters=5, samples=3,
                             chains=[Chain(a), Chain(a, out), Chain(b)])  # fmt: skip
    torch.cuda.synchronize()
    for t in times:
        assert t.get("graph_error") is None and t.get("eager_error") is None, t
        assert t["graph"] > 0 and t["eager"] > 0


def test_a_long_call_is_timed_with_fewer_calls_a_sample_never_below_the_floor() -> None:
    from autotaxer.measure import MIN_CALLS_PER_SAMPLE, calls_per_sample

    assert calls_per_sample(100.0, 20, 10_000.0) == 20  # short: the configured iters
    assert calls_per_sample(1_000.0, 20, 10_000.0) == 10
    assert calls_per_sample(12_000.0, 20, 10_000.0) == MIN_CALLS_PER_SAMPLE  # 3 calls of 12 ms, not 20
    assert calls_per_sample(12_000.0, 2, 10_000.0) == 2  # never above iters
    for unknown in (math.inf, math.nan, 0.0, -1.0):
        assert calls_per_sample(unknown, 20, 10_000.0) == 20


def test_time_variant_on_cpu_times_the_iters_it_is_given_whatever_sample_us(monkeypatch) -> None:
    """``sample_us`` is a GPU rule: on CPU every sample still runs ``iters`` calls."""
    from types import SimpleNamespace

    from autotaxer import measure

    monkeypatch.setattr(measure, "warm_up", lambda ctx: None)
    monkeypatch.setattr(measure, "_barrier", lambda ctx: None)
    monkeypatch.setattr(measure, "_max_over_ranks", lambda value, ctx: value)
    ctx = SimpleNamespace(target=SimpleNamespace(device_type="cpu"))
    calls: list[int] = []
    measure.time_variant(lambda: calls.append(1), ctx, warmup=1, iters=4, samples=3, sample_us=1.0)
    assert len(calls) == 1 + 3 * 4


@pytest.mark.parametrize("fail", [False, True])
def test_a_captured_graph_is_destroyed_when_its_samples_are_taken(monkeypatch, fail: bool) -> None:
    """A trial's graph (in ``graph`` mode it may hold an all-gather, and with it the NCCL communicator
    that ``destroy_process_group`` must end) is reset as soon as its samples are taken, also when a
    sample fails; the sampler refuses to run after."""
    from types import SimpleNamespace

    from autotaxer import measure

    reset: list[int] = []

    def reset_graph():
        reset.append(1)
        if fail:  # a sticky CUDA error after the failed sample: the sample's error is the one raised
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    graph = SimpleNamespace(reset=reset_graph)
    made: list[measure._Sampler] = []

    def prepare(fn, ctx, mode, warmup, iters):
        made.append(measure._Sampler(fn, iters, on_cuda=False, graph=graph))
        return made[-1]

    def sample(sampler, ctx, lead_in=False):
        if fail:
            raise RuntimeError("peer timed out")
        sampler.body()
        return 1.0

    monkeypatch.setattr(measure, "warm_up", lambda ctx: None)
    monkeypatch.setattr(measure, "_prepare", prepare)
    monkeypatch.setattr(measure, "_sample_us", sample)
    monkeypatch.setattr(measure, "_max_over_ranks", lambda value, ctx: value)
    ctx = SimpleNamespace(target=SimpleNamespace(device_type="cpu"))
    if fail:
        with pytest.raises(RuntimeError, match="peer timed out"):
            measure.time_variant(lambda: None, ctx, warmup=1, iters=4, samples=3)
    else:
        assert measure.time_variant(lambda: None, ctx, warmup=1, iters=4, samples=3) == 1.0
    assert reset == [1] and made[0].graph is None
    with pytest.raises(RuntimeError, match="released"):
        made[0].body()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_trial_of_a_long_call_on_a_gpu_times_fewer_calls_a_sample(mode: str) -> None:
    """A ~6 ms call with ``sample_us`` of 10 ms: 3 calls a sample (captured: 3 calls in the graph) instead
    of 20 (any call above 3.4 ms gets the floor of 3)."""
    import torch

    from autotaxer._target import cuda_target
    from autotaxer.measure import time_variant
    from autotaxer.ops import RunContext

    ctx = RunContext(rank=0, world_size=1, device=torch.device("cuda", 0), target=cuda_target(0))
    calls: list[int] = []
    torch.cuda._sleep(1_000_000)  # the clock up before sizing the sleep
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles = int(1_000_000 * 6.0 / start.elapsed_time(end))  # about 6 ms

    def long_call() -> None:
        calls.append(1)
        torch.cuda._sleep(cycles)

    t = time_variant(long_call, ctx, warmup=2, iters=20, mode=mode, samples=3, sample_us=10_000.0)
    adaptive = len(calls)
    calls.clear()
    time_variant(long_call, ctx, warmup=2, iters=20, mode=mode, samples=3)
    # eager: 2 sizing + 2 warm-up + 3 samples of (1 untimed lead-in + 3); graph: 2 + 2 + 3 captured
    assert adaptive == (2 + 2 + 3 * 4 if mode == "eager" else 2 + 2 + 3), adaptive
    assert len(calls) == (2 + 60 if mode == "eager" else 2 + 20)
    assert math.isfinite(t) and t > 0


def test_a_call_returning_a_fresh_output_is_linked_from_that_output_before_the_next_call(monkeypatch) -> None:
    """Without ``Chain.out`` (a peer returning a fresh tensor), each call is followed at once by the link
    from its own output: a CUDA graph that captures calls then reads only the outputs it captured, never
    one freed since (read after the next capture released the cache: an illegal address on 2xH200)."""
    import torch

    from autotaxer.measure import Chain

    log = _logged_links(monkeypatch)
    feeds = torch.zeros(3)
    outputs: list = []

    def call():
        outputs.append(torch.full((2,), float(len(outputs))))
        log.append(("call", outputs[-1].data_ptr()))
        return outputs[-1]

    wrapped = Chain(feeds).wrap(call)
    for _ in range(3):
        wrapped()
    expected = []
    for out in outputs:
        expected += [("call", out.data_ptr()), ("link", out.data_ptr(), feeds.data_ptr())]
    assert log == expected
    with pytest.raises(ValueError, match="returned no tensor"):
        Chain(feeds).wrap(lambda: None)()
