"""Validate and time one variant on every rank: shared by the tuner, bench scripts and tests.

``check_variant`` runs a variant on fresh random inputs (two seeds) into a NaN-poisoned output and
returns the relative error against the op's fp32 reference; the caller compares it with
``op.tolerance(key)``. ``time_variant`` times a zero-argument callable: CUDA events around back-to-back
calls (``eager``) or around replays of a CUDA graph that captured the calls (``graph``), perf_counter
between barriers on CPU; ``time_interleaved`` times several callables the same way, one sample of each in
turn, for side-by-side comparisons. The median over samples is reduced with MAX across ranks, so every
rank returns the same number: the time of the slowest rank.

Timed calls are chained by default (:class:`Chain`, ``TimingConfig.chain == "dependent"``): before each
call, one byte of an input the call reads is made to depend on the previous call's output (an integer add
of 0 times that output's first byte, on the current stream, so values never change, NaN and inf included;
captured with the calls in ``graph`` mode), as in a model, whose next projection reads what the last one
wrote. The link's own cost, timed alone in the same way, is subtracted. ``back-to-back`` leaves the calls
unlinked (what every timing was before 2026-11-27).

Before its first timed measurement a process is warmed up once (:func:`warm_up`: the first collective,
the first vendor GEMM, on CUDA the first graph capture, for at least :data:`PROCESS_WARMUP_S`), so the
first shape of a run is timed in the same state as the last: without it the first BSP time of a CPU run
read 5-30x its later value, and stored speedups that did not exist.

Every function here is collective: all ranks of ``ctx.group`` call it with the same arguments.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._capture import gc_paused
from ._problem import ProblemKey
from .ops._base import Op, Params, RunContext, Variant, Workspace, relative_error

TIMING_MODES = ("eager", "graph")
#: How successive timed calls relate: each waits for the previous one's output, or none waits.
CHAINS = ("dependent", "back-to-back")

#: Seed of :func:`time_interleaved`'s sample order (fixed: every rank must draw the same order).
_ORDER_SEED = 20261122

#: Offset between the two validation seeds (any value that keeps them distinct works).
_SECOND_SEED_OFFSET = 7919

#: Seconds the once-per-process warm-up runs at least, per device type: long enough for lazy thread
#: pools, allocator pools, communicator buffers and clocks to settle, short beside a group's launch.
PROCESS_WARMUP_S = {"cpu": 0.2, "cuda": 1.0}

#: A tuner trial's timed calls per sample (eager) or per captured graph: at most ``iters``, fewer where
#: that many would run past about this many µs (a 12 ms GEMM needs no 20 calls a sample to be timed to
#: a fraction of a percent, and 140 of them were most of a large key's trial), and never fewer than
#: :data:`MIN_CALLS_PER_SAMPLE`. The benchmark and the confirmation time the ``iters`` they are given.
TRIAL_SAMPLE_US = 10_000.0
MIN_CALLS_PER_SAMPLE = 3


@dataclass(frozen=True)
class TimingConfig:
    """How a trial is timed: ``warmup`` calls, then ``samples`` samples of ``iters`` calls, each call
    waiting for the previous one's output (``chain="dependent"``) or not (``"back-to-back"``)."""

    mode: str = "eager"
    warmup: int = 5
    iters: int = 20
    samples: int = 7
    chain: str = "dependent"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        if self.mode not in TIMING_MODES:
            raise ValueError(f"mode: expected one of {', '.join(TIMING_MODES)}, got {self.mode!r}")
        if self.chain not in CHAINS:
            raise ValueError(f"chain: expected one of {', '.join(CHAINS)}, got {self.chain!r}")
        for name in ("warmup", "iters", "samples"):
            value = getattr(self, name)
            low = 0 if name == "warmup" else 1
            if value < low:
                raise ValueError(f"{name}: must be >= {low}, got {value}")

    @classmethod
    def for_device(cls, device_type: str, mode: str = "eager", chain: str = "dependent") -> TimingConfig:
        """Defaults per device: many short samples on GPUs, a few on CPU (where calls take milliseconds)."""
        if device_type == "cpu":
            return cls(mode=mode, warmup=1, iters=3, samples=3, chain=chain)
        return cls(mode=mode, chain=chain)


@dataclass(frozen=True)
class Chain:
    """What links one timed call to the next: ``feeds``, a tensor every call reads (e.g. the A shard), is
    made to depend on the previous call's output (``out`` when the call writes into it, else the tensor
    the call returns). Inputs shared with other timed entries are safe: the link never changes a value."""

    feeds: Any
    out: Any = None

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` preceded, from its second call on, by the link from ``out`` to ``feeds``; without
        ``out``, ``fn`` followed by the link from the tensor it returned. That tensor is fresh each call: a
        link before the next call would read the previous call's, which a CUDA graph captured then keeps
        reading after it is freed (``autotaxer bench``'s peer, torch's fused op, read a tensor that the
        next capture's cache release unmapped: an illegal memory access, 2xH200, 2026-11-28)."""
        dst = _first_byte(self.feeds)
        if self.out is None:

            def call_then_link() -> Any:
                result = fn()
                if result is None:
                    raise ValueError("chain: the timed call returned no tensor and Chain.out is unset")
                link(_first_byte(result), dst)
                return result

            return call_then_link
        last: list[Any] = []  # the previous call's output, as its first byte

        def call() -> Any:
            if last:
                link(last[0], dst)
            result = fn()
            last[:] = [_first_byte(self.out)]
            return result

        return call

    def alone(self) -> Callable[[], Any]:
        """The link by itself (from ``out``, else from ``feeds`` to itself): timed to subtract its cost."""
        dst = _first_byte(self.feeds)
        src = _first_byte(self.out) if self.out is not None else dst
        return lambda: link(src, dst)


def link(src: Any, dst: Any) -> None:
    """Make the one-byte tensor ``dst`` depend on the one-byte tensor ``src`` (both ``uint8`` views from
    :func:`_first_byte`) without changing it: ``dst += 0 * src`` in integer arithmetic, one kernel on the
    current stream (exact for every byte, where ``0 * x`` in floating point is NaN for NaN or inf)."""
    dst.add_(src, alpha=0)


def _first_byte(t: Any) -> Any:
    """The first byte of ``t``'s element at index 0 (any layout, any dtype) as a ``uint8`` view of one
    element, so writes land in ``t``'s own storage."""
    import torch

    first = t.as_strided((1,), (1,), t.storage_offset())
    return first.view(torch.uint8)[:1]


def check_variant(
    op: Op,
    variant: Variant,
    key: ProblemKey,
    params: Params,
    ctx: RunContext,
    seed: int,
    ws: Workspace | None = None,
    run: Callable[..., Any] | None = None,
) -> float:
    """Largest relative error of ``variant`` against ``op.reference`` over two fresh seeds (collective).

    The output is filled with NaN before each run, so elements a variant never writes fail the check.
    ``ws`` reuses a workspace from ``variant.prepare``; without it one is prepared here. ``run`` launches
    the variant (default ``variant.run``; the tuner passes :func:`autotaxer.runtime.replay.launcher`'s,
    so what is checked is what is served).
    """
    if run is None:
        run = variant.run
    if ws is None:
        ws = variant.prepare(key, params, ctx)
    worst = 0.0
    for s in (seed, seed + _SECOND_SEED_OFFSET):
        inputs = op.make_inputs(key, ctx.rank, ctx.device, s)
        out = op.empty_output(key, ctx.device)
        result = run(ws, inputs, ctx, out=out)
        got = out if result is None else result
        _synchronize(ctx)
        err = relative_error(got, op.reference(key, ctx.rank, ctx.device, s))
        worst = max(worst, err)
    return worst


def time_variant(
    fn: Callable[[], Any],
    ctx: RunContext,
    warmup: int = 5,
    iters: int = 20,
    mode: str = "eager",
    samples: int = 7,
    chain: Chain | None = None,
    sample_us: float | None = None,
) -> float:
    """Median time of one call of ``fn`` in microseconds, MAX over ranks (collective).

    GPU ``eager``: CUDA events around ``iters`` calls, ``samples`` times, a barrier before each sample.
    GPU ``graph``: ``iters`` calls captured in one CUDA graph, each sample one replay. CPU:
    ``time.perf_counter`` around ``iters`` calls after a barrier (``graph`` is refused). With ``chain``
    each call waits for the previous one's output, and the link's own median (timed alone the same way,
    MAX over ranks) is subtracted; without it the calls run back to back. ``sample_us`` (GPU): fewer
    calls a sample where ``iters`` of the slowest rank's call would take longer
    (:func:`calls_per_sample`; then an eager sample starts behind one untimed call; the link keeps
    ``iters``).
    """
    TimingConfig(mode=mode, warmup=warmup, iters=iters, samples=samples).validate()
    warm_up(ctx)
    timed = fn if chain is None else chain.wrap(fn)
    calls = iters
    if sample_us is not None and ctx.target.device_type == "cuda":
        calls = calls_per_sample(_max_over_ranks(_one_call_us(timed, ctx, warmup), ctx), iters, sample_us)
    sampler = _prepare(timed, ctx, mode, warmup, calls)
    # fewer calls: each eager sample starts behind an untimed one (no idle GPU at its first launch)
    per_call = _samples_then_release(sampler, ctx, samples, lead_in=calls < iters)
    raw = _max_over_ranks(statistics.median(per_call), ctx)
    if chain is None:
        return raw
    link_samples = _samples_then_release(_prepare(chain.alone(), ctx, mode, warmup, iters), ctx, samples)
    return less_link(raw, _max_over_ranks(statistics.median(link_samples), ctx))


def _samples_then_release(
    sampler: _Sampler, ctx: RunContext, samples: int, lead_in: bool = False
) -> list[float]:
    """``samples`` runs of ``sampler`` (:func:`_sample_us`), then its captured graph released, before the
    next one is made and also when a sample fails (the sample's error is the one raised)."""
    try:
        taken = [_sample_us(sampler, ctx, lead_in=lead_in) for _ in range(samples)]
    except BaseException:
        sampler.release(quiet=True)
        raise
    sampler.release()
    return taken


def calls_per_sample(call_us: float, iters: int, sample_us: float) -> int:
    """Timed calls a sample for a call of about ``call_us``: ``iters``, or fewer where they would take
    more than ``sample_us`` in all, never below :data:`MIN_CALLS_PER_SAMPLE` (nor above ``iters``); an
    unknown duration (not finite, not positive) keeps ``iters``."""
    if not (math.isfinite(call_us) and call_us > 0):
        return iters
    return max(min(MIN_CALLS_PER_SAMPLE, iters), min(iters, math.ceil(sample_us / call_us)))


def _one_call_us(fn: Callable[[], Any], ctx: RunContext, warmup: int) -> float:
    """The fastest of ``max(warmup, 1)`` one-call samples of ``fn`` on this rank (:func:`_sample_us`; the
    first call may compile or allocate, so the fastest, not the mean), in µs (collective)."""
    one = _Sampler(fn, 1, on_cuda=True)
    return min(_sample_us(one, ctx) for _ in range(max(warmup, 1)))


def less_link(raw_us: float, link_us: float) -> float:
    """A chained call's time less its link's: ``raw_us`` itself where the link timed alone is not below it
    (a call too short to tell them apart, e.g. a no-op on CPU)."""
    return raw_us - link_us if 0 <= link_us < raw_us else raw_us


def time_interleaved(
    fns: Sequence[Callable[[], Any]],
    ctx: RunContext,
    modes: Sequence[str] = ("eager",),
    warmup: int = 5,
    iters: int = 20,
    samples: int = 7,
    chains: Sequence[Chain | None] | None = None,
) -> list[dict[str, Any]]:
    """Time several callables side by side: per callable, ``{mode: median µs (max over ranks)}``.

    Every callable is warmed up (and captured, in ``graph`` mode) first; then ``samples`` rounds each take
    one sample of every (callable, mode) in a shuffled order (seeded: the same on every rank). A slow
    stretch of the machine (clock or power state, a neighbour's traffic) then lands on every entry alike
    instead of on whichever was timed during it, and no entry always follows the same one (a GPU that has
    just run a light entry boosts its clock for the next). An eager sample starts with one untimed call,
    so its timed calls queue behind work as in a loop of calls. Ratios between the entries are steadier
    than from one :func:`time_variant` after another. An entry that fails to prepare or to run gets
    ``{mode: None, f"{mode}_error": text}`` and leaves the rounds; the others go on (collective).

    ``chains``: per callable, a :class:`Chain` (its calls wait for each other's outputs) or None (back to
    back). Then the link alone is one more entry of the rounds, and each chained entry's time is less its
    median, which the entry also holds as ``f"{mode}_link"`` (µs).
    """
    for mode in modes:
        TimingConfig(mode=mode, warmup=warmup, iters=iters, samples=samples).validate()
    chains = list(chains) if chains is not None else [None] * len(fns)
    if len(chains) != len(fns):
        raise ValueError(f"chains: expected one per callable ({len(fns)}), got {len(chains)}")
    warm_up(ctx)
    first_chain = next((c for c in chains if c is not None), None)
    entries = [c.wrap(fn) if c is not None else fn for fn, c in zip(fns, chains, strict=True)]
    if first_chain is not None:
        entries.append(first_chain.alone())  # the link alone: its cost, in the same rounds
    results: list[dict[str, Any]] = [{} for _ in entries]
    live: list[tuple[int, str, _Sampler]] = []
    for i, fn in enumerate(entries):
        for mode in modes:
            try:
                live.append((i, mode, _prepare(fn, ctx, mode, warmup, iters)))
            except Exception as exc:
                results[i].update(_failed(mode, exc))
    per_call: dict[tuple[int, str], list[float]] = {(i, mode): [] for i, mode, _ in live}
    rng = random.Random(_ORDER_SEED)
    for _ in range(samples):
        for i, mode, sampler in rng.sample(live, len(live)):
            if (i, mode) not in per_call:
                continue
            try:
                per_call[(i, mode)].append(_sample_us(sampler, ctx, lead_in=True))
            except Exception as exc:
                del per_call[(i, mode)]
                results[i].update(_failed(mode, exc))
    for _, _, sampler in live:  # captured graphs go before the reductions
        sampler.release()
    live.clear()
    for (i, mode), times in per_call.items():
        results[i][mode] = _max_over_ranks(statistics.median(times), ctx)
    if first_chain is None:
        return results
    link_times = results.pop()
    for result, c in zip(results, chains, strict=True):
        for mode in modes:
            link_us = link_times.get(mode)
            if c is not None and result.get(mode) is not None and link_us is not None:
                result[mode] = less_link(result[mode], link_us)
                result[f"{mode}_link"] = link_us
    return results


def warm_up(ctx: RunContext, seconds: float | None = None) -> None:
    """Warm this rank's process up for timing, once per ``ctx`` (collective; later calls return at once).

    Rounds of what every measured variant is made of (an all-gather, a vendor GEMM, a barrier; on CUDA
    also one CUDA-graph capture and replay of a GEMM) until every rank has spent ``seconds`` (default
    :data:`PROCESS_WARMUP_S` of the device type); the ranks agree on when to stop by an all-reduce per
    round, so none is left waiting in a collective. :func:`time_variant` and :func:`time_interleaved`
    call it first, so every timed measurement of a process follows the same warm-up.
    """
    if ctx.warmed_up:
        return
    import torch

    on_cuda = ctx.target.device_type == "cuda"
    budget = PROCESS_WARMUP_S["cuda" if on_cuda else "cpu"] if seconds is None else seconds
    dtype = torch.bfloat16 if on_cuda else torch.float32
    size = 1024 if on_cuda else 256
    a = torch.randn((size, size), device=ctx.device).to(dtype)
    shard = a[: max(1, size // ctx.world_size)].contiguous()
    gathered = torch.empty((ctx.world_size, *shard.shape), dtype=dtype, device=ctx.device)
    if on_cuda:
        _warm_graph(lambda: torch.matmul(a, a), ctx)
    t0 = time.perf_counter()
    while True:
        _all_gather(shard, gathered, ctx)
        torch.matmul(a, a)
        _synchronize(ctx)
        if _min_over_ranks(time.perf_counter() - t0, ctx) >= budget:  # every rank has spent the budget
            break
    _barrier(ctx)
    ctx.warmed_up = True


def error_text(exc: BaseException) -> str:
    """``exc`` as one short line for results files: its type and message, at most 300 characters."""
    return f"{type(exc).__name__}: {exc}"[:300]


def _failed(mode: str, exc: BaseException) -> dict[str, Any]:
    """A timing entry's result for ``mode`` when preparing or running it raised ``exc``."""
    return {mode: None, f"{mode}_error": error_text(exc)}


def max_over_ranks(value: float, ctx: RunContext) -> float:
    """``value`` reduced with MAX over the ranks of ``ctx.group`` (collective)."""
    return _max_over_ranks(value, ctx)


def maxes_over_ranks(values: Sequence[float], ctx: RunContext) -> list[float]:
    """Each of ``values`` reduced with MAX over the ranks of ``ctx.group``, in one collective."""
    if ctx.world_size == 1 or not _dist_active():
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.group)
    return [float(v) for v in t.tolist()]


# -- internals ------------------------------------------------------------------------------------


def _dist_active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _barrier(ctx: RunContext) -> None:
    if ctx.world_size > 1 and _dist_active():
        import torch.distributed as dist

        dist.barrier(group=ctx.group)


def _all_gather(shard: Any, gathered: Any, ctx: RunContext) -> None:
    """All-gather ``shard`` into ``gathered`` (``(world_size, *shard.shape)``), as BSP does."""
    from .ops._collectives import all_gather_shards

    all_gather_shards(shard, gathered, ctx)


def _warm_graph(fn: Callable[[], Any], ctx: RunContext) -> None:
    """Capture ``fn`` (local work only: no collective) in a CUDA graph and replay it once: the first
    capture of a process sets up graph memory pools and library state that later captures reuse."""
    import torch

    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize(ctx.device)


def _synchronize(ctx: RunContext) -> None:
    if ctx.target.device_type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.device)


def _max_over_ranks(value: float, ctx: RunContext) -> float:
    return _reduce_over_ranks(value, ctx, "MAX")


def _min_over_ranks(value: float, ctx: RunContext) -> float:
    return _reduce_over_ranks(value, ctx, "MIN")


def _reduce_over_ranks(value: float, ctx: RunContext, op: str) -> float:
    if ctx.world_size == 1 or not _dist_active():
        return float(value)
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=ctx.group)
    return float(t.item())


@dataclass
class _Sampler:
    """One timed entry in one mode, warmed up (and, in ``graph`` mode, captured): ``body()`` makes
    ``calls`` calls; ``one()`` makes one untimed call (None in ``graph`` mode); ``graph`` keeps the
    captured graph alive while the sampler is."""

    body: Callable[[], Any]
    calls: int
    on_cuda: bool
    one: Callable[[], Any] | None = None
    graph: Any = None

    def release(self, quiet: bool = False) -> None:
        """Destroy the captured graph now (:func:`release_graphs`); the sampler runs no more after."""
        if self.graph is None:
            return
        graphs = [self.graph]
        self.graph, self.body = None, _released
        release_graphs(graphs, quiet)


def _released() -> None:
    raise RuntimeError("this sampler's CUDA graph was released")


def release_graphs(graphs: list[Any], quiet: bool = False) -> None:
    """Destroy ``graphs`` now (after the device is done with them) and empty the list. A CUDA graph that
    captured a collective holds its NCCL communicator until the graph is destroyed: one left to the
    garbage collector makes ``destroy_process_group`` wait for it, forever where nothing collects it.
    Every graph is released even where one fails; the first error is raised, unless ``quiet`` (while
    another error propagates: a failed capture's graph, a sticky CUDA error)."""
    errors: list[Exception] = []
    if graphs:
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - each graph is still released
            errors.append(exc)
    for graph in graphs:
        try:
            graph.reset()
        except Exception as exc:  # noqa: BLE001 - the others are still released
            errors.append(exc)
    graphs.clear()
    if errors and not quiet:
        raise errors[0]


def _prepare(fn: Callable[[], Any], ctx: RunContext, mode: str, warmup: int, iters: int) -> _Sampler:
    """Warm ``fn`` up and build its sampler for ``mode`` (collective: graph capture runs NCCL calls)."""
    if ctx.target.device_type != "cuda":
        if mode == "graph":
            raise ValueError("mode: 'graph' timing needs CUDA; use 'eager' on CPU")
        for _ in range(warmup):
            fn()
        return _Sampler(lambda: [fn() for _ in range(iters)], iters, on_cuda=False, one=fn)
    import torch

    if mode == "eager":
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(ctx.device)

        def calls() -> None:
            for _ in range(iters):
                fn()

        return _Sampler(calls, iters, on_cuda=True, one=fn)
    # Warm up on a side stream (what torch.cuda.graph expects), so lazy allocations and compiles
    # happen outside the capture.
    side = torch.cuda.Stream(device=ctx.device)
    side.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream(ctx.device).wait_stream(side)
    torch.cuda.synchronize(ctx.device)
    # Every rank must be out of its warm-up collectives before any rank starts capturing.
    _barrier(ctx)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()  # first replay uploads the graph; not timed
    torch.cuda.synchronize(ctx.device)
    return _Sampler(graph.replay, iters, on_cuda=True, graph=graph)


def _sample_us(sampler: _Sampler, ctx: RunContext, lead_in: bool = False) -> float:
    """µs per call of one run of ``sampler`` (a barrier first): CUDA events on the current stream, or
    ``perf_counter`` on CPU. ``lead_in``: one untimed call between the barrier and the timed ones (eager
    only), so the timed calls queue behind work as in a loop of calls instead of starting on an idle GPU."""
    _barrier(ctx)
    if lead_in and sampler.one is not None:
        sampler.one()
    if not sampler.on_cuda:
        t0 = time.perf_counter()
        sampler.body()
        return (time.perf_counter() - t0) * 1e6 / sampler.calls
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    sampler.body()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / sampler.calls
