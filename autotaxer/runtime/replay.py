"""Calls launched as CUDA-graph replays: one launch a call instead of a schedule's dozens.

A copy-engine schedule launches 10-30 things a call from Python (1-program Triton flag kernels, stream
memops, peer copies, one vendor GEMM per chunk, events, stream switches). On 2xH200 that is ~470-500 µs
of host time a call (a Triton launch 20-32 µs, a stream switch 18 µs), as much as the call's GPU time,
and 1.1-1.2 ms at 4 ranks, more than it: a model that calls it back to back is bound by its host, and a
peer whose host is late makes the other spin. Captured once into a CUDA graph and replayed, the same call
costs 19 µs (2 ranks) to 49 µs (4) of host time and its chained GPU time fell 3-10 % at 2 ranks, 2-3.7x
at 4 (``bench/results/2026-11-27_replay_layer_h200x4/``).

A variant may be replayed when nothing its host code decides differs from call to call (its flags,
epochs and tokens live on the device); its op lists it in ``Op.replayed``. ``torch_fused`` is one
(torch's op: a barrier and copies on its side stream, all on the device, its workspace grown before any
capture; at 4 ranks its eager calls took 489-701 µs against 144-287 µs replayed in a graph,
``bench/results/2026-11-28_tp4_tuned_layer_h200x4/``, so eager-timed trials never chose it): it joined
both ops' lists when ``tests/ops/test_torch_fused_gpu.py``'s replay test passed on 2xH200 (2026-11-28,
``bench/results/2026-11-28_ws2_ship_h200x2/``). Each run's graphs
share one memory pool, so what a call allocates inside (torch's op: a fresh product) is held once a run.
:func:`launcher` gives the callable that runs it (``run(ws, inputs, ctx, out) -> out``, the variant's own
signature), and dispatch, the tuner's trials and its confirmations all use it: what was timed is what is
served.

How a call is replayed (:class:`ReplayedRun`): the first call is launched eagerly (it compiles the
kernels, makes the streams' vendor handles: nothing a capture may do; a first capture failed on
2xH200 without it). Then a call's *argument set* is the workspace and every input's and the output's
address, shape, strides and dtype; the first call of an argument set is captured
(on a private stream, nothing runs) and every call of it is a replay, so a graph only ever reads and
writes the tensors of the call that replays it. A call without ``out`` gets a fresh output (as the
eager call does), which the caching allocator hands out at the same address from step to step. Calls
are launched eagerly where a graph cannot help or cannot be made: not on CUDA, during a CUDA graph
capture (the user's graph records the eager launches), after a capture failed, and once the argument
sets stop repeating (more than ``limit`` graphs evicted: addresses that change every call would
capture every call); a run that is named (dispatch's are: key and variant) warns once when it turns
eager. ``$AUTOTAXER_REPLAY=0`` launches every call eagerly, and so does every run while
:func:`eager_calls` holds (the in-step check's graph-timed steps, which time the step's own graph).

Calls that also hand out what backward keeps (``Variant.run_for_backward``: training's, ``return_A``) are
replayed the same way where the variant writes both into an ``out=`` pair (:func:`saving_launcher`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .._capture import gc_paused

#: ``$AUTOTAXER_REPLAY=0``: launch every call eagerly (an A/B switch for benchmarks and debugging).
REPLAY_ENV = "AUTOTAXER_REPLAY"
#: Graphs kept per replayed run (least recently used evicted): one per argument set, e.g. per layer of a
#: model whose layers share one shape.
DEFAULT_LIMIT = 256

Run = Callable[..., Any]


_EAGER_HOLDS = 0  # > 0: every ReplayedRun call is launched eagerly (eager_calls)


@contextlib.contextmanager
def eager_calls() -> Any:
    """Launch every replayed run's calls eagerly while the block runs: no graph is captured or replayed,
    the ones held are kept for later. The in-step check's graph-timed steps (``check_graphs``) use it:
    what they time is the step's own CUDA graph, which records each call's eager launches anyway, so
    the variants' graphs would only be replayed in the untimed steps. Those replays are where the check
    segfaulted twice on 2xH200 (``ag_gemm`` ``copy_engine``, 2026-11-28); with ``$AUTOTAXER_REPLAY=0``
    the same check finished (``bench/results/2026-11-28_ws2_finish_h200x2/``)."""
    global _EAGER_HOLDS
    _EAGER_HOLDS += 1
    try:
        yield
    finally:
        _EAGER_HOLDS -= 1


def replay_enabled() -> bool:
    """Whether calls of replayable variants are replayed in this process (``$AUTOTAXER_REPLAY``)."""
    return os.environ.get(REPLAY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def replayable(opobj: Any, variant: Any, device: Any) -> bool:
    """Whether ``variant``'s calls on ``device`` are launched as graph replays."""
    return (
        variant.name in getattr(opobj, "replayed", ())
        and torch.device(device).type == "cuda"
        and replay_enabled()
    )


def launcher(opobj: Any, variant: Any, key: Any, device: Any, limit: int = DEFAULT_LIMIT,
             name: str | None = None) -> Run:  # fmt: skip
    """The callable that runs ``variant`` for ``key`` (``run(ws, inputs, ctx, out=None) -> output``): a
    :class:`ReplayedRun` where :func:`replayable`, else the variant's own ``run``. ``name``: what its
    warning names when it turns eager (None: no warning, as for the tuner's trials)."""
    if not replayable(opobj, variant, device):
        return variant.run
    spec = opobj.empty_output(key, "meta")
    return ReplayedRun(variant.run, tuple(spec.shape), spec.dtype, limit, name=name)


def saving_launcher(opobj: Any, variant: Any, device: Any, limit: int = DEFAULT_LIMIT,
                    name: str | None = None) -> Callable[[Any, tuple, Any], Any]:  # fmt: skip
    """The callable that runs ``variant.run_for_backward(ws, inputs, ctx) -> (output, saved)``: replayed
    like :func:`launcher` where :func:`replayable` and the variant writes both into an ``out=`` pair (the
    pair's shapes learned from the first, eager call), else the variant's own method."""
    if not (
        replayable(opobj, variant, device)
        and variant.saves_for_backward()
        and _takes_out(variant.run_for_backward)
    ):
        return variant.run_for_backward

    def run_saving(ws: Any, inputs: tuple, ctx: Any, out: Any = None) -> Any:
        return variant.run_for_backward(ws, inputs, ctx, out=out)

    return ReplayedRun(run_saving, None, None, limit, name=name)


def _takes_out(method: Any) -> bool:
    import inspect

    return "out" in inspect.signature(method).parameters


def _arg(t: Any) -> tuple:
    if isinstance(t, tuple):  # an output pair (a saving call's)
        return tuple(_arg(x) for x in t)
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


def _spec(result: Any) -> tuple[Any, Any]:
    """``(shape, dtype)`` of an output, or of each of an output tuple's tensors (tuples of them)."""
    if isinstance(result, tuple):
        specs = [_spec(x) for x in result]
        return tuple(s for s, _ in specs), tuple(d for _, d in specs)
    return tuple(result.shape), result.dtype


def _empty(shape: Any, dtype: Any, device: Any) -> Any:
    """A fresh output of ``shape`` and ``dtype`` (tuples of them: a tuple of outputs)."""
    if isinstance(dtype, tuple):
        return tuple(_empty(s, d, device) for s, d in zip(shape, dtype, strict=True))
    return torch.empty(shape, dtype=dtype, device=device)


def _same(returned: Any, out: Any) -> bool:
    """Whether the run returned its ``out`` argument (each tensor of an output tuple)."""
    if isinstance(out, tuple):
        return (
            isinstance(returned, tuple)
            and len(returned) == len(out)
            and all(r is o for r, o in zip(returned, out, strict=True))
        )
    return returned is out


class ReplayedRun:
    """``run`` (a variant's ``run(ws, inputs, ctx, out)``) with each argument set captured once into a
    CUDA graph and replayed; see the module docstring. ``capture(fn) -> graph`` makes a graph of ``fn``'s
    launches whose ``replay()`` repeats them (default: :func:`capture_cuda_graph`, every graph of this run
    in one memory pool); tests pass their own, with the ``device_type`` whose calls are replayed (others
    are launched eagerly)."""

    def __init__(self, run: Run, out_shape: Any, out_dtype: Any, limit: int = DEFAULT_LIMIT,
                 capture: Callable[[Callable[[], Any]], Any] | None = None,
                 device_type: str = "cuda", name: str | None = None) -> None:  # fmt: skip
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        self.run = run
        self.out_shape = out_shape
        self.out_dtype = out_dtype
        self.limit = limit
        #: None: :meth:`_capture_in_pool` (not stored as a bound method: that would make the run a
        #: reference cycle, freed with its graphs by the cyclic collector at any time, e.g. during a capture)
        self.capture = capture
        #: the memory pool every graph of this run allocates from (made at the first capture)
        self.pool: Any = None
        self.device_type = device_type
        self.name = name
        #: argument set -> (graph, workspace): the workspace held so its id names no other while cached
        self.graphs: dict[tuple, tuple[Any, Any]] = {}
        self.captures = 0
        self.replays = 0
        self.evictions = 0
        self.warm = False  # the first call runs eagerly
        #: why calls are launched eagerly from now on (None: replayed)
        self.off: str | None = None

    def __call__(self, ws: Any, inputs: tuple, ctx: Any, out: Any = None) -> Any:
        if self.off is not None or _EAGER_HOLDS or _eager_only(inputs, self.device_type):
            return self.run(ws, inputs, ctx, out)
        if not self.warm:  # the first call: eager (compiles kernels, makes handles)
            self.warm = True
            result = self.run(ws, inputs, ctx, out)
            if self.out_dtype is None and result is not None:  # the outputs' shapes learned here
                self.out_shape, self.out_dtype = _spec(result)
            return result
        if out is None:
            if self.out_dtype is None:  # nothing learned: no fresh output can be made for a capture
                return self.run(ws, inputs, ctx, out)
            out = _empty(self.out_shape, self.out_dtype, inputs[0].device)
        args = (id(ws), tuple(_arg(t) for t in inputs), _arg(out))
        entry = self.graphs.pop(args, None)
        if entry is None:
            entry = self._capture(ws, inputs, ctx, out)
            if entry is None:  # could not be captured: this call and every later one eager
                return self.run(ws, inputs, ctx, out)
        self.graphs[args] = entry  # newest last: the first key is the least recently used
        entry[0].replay()
        self.replays += 1
        return out

    def _capture(self, ws: Any, inputs: tuple, ctx: Any, out: Any) -> tuple[Any, Any] | None:
        returned: list[Any] = []
        try:
            capture = self.capture if self.capture is not None else self._capture_in_pool
            graph = capture(lambda: returned.append(self.run(ws, inputs, ctx, out)))
        except Exception as exc:  # noqa: BLE001 - any capture failure: launch eagerly (errors raise there)
            self.turn_off(f"capture failed: {type(exc).__name__}: {exc}")
            return None
        if returned and returned[0] is not None and not _same(returned[0], out):
            self.turn_off("the variant returned another tensor than its out= argument")
            return None
        self.captures += 1
        if len(self.graphs) >= self.limit:
            self._settle()
            del self.graphs[next(iter(self.graphs))]
            self.evictions += 1
            if self.evictions > self.limit:
                self.turn_off(f"argument sets do not repeat ({self.evictions} graphs evicted)")
                return None
        return graph, ws

    def _capture_in_pool(self, fn: Callable[[], Any]) -> Any:
        """:func:`capture_cuda_graph` into this run's one pool: what a variant allocates inside its call
        (``torch_fused``: torch's op returns a fresh product, copied into ``out``) is held once per run,
        not once per argument set (a model's layers: one graph each). Safe because nothing allocated in a
        graph outlives its replay and the replays of one run follow each other on the caller's stream."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return capture_cuda_graph(fn, self.pool)

    def turn_off(self, why: str) -> None:
        """Launch every later call eagerly, for ``why``; the graphs go (a named run warns)."""
        self.off = why
        self._settle()
        self.graphs.clear()
        if self.name is not None:
            message = f"autotaxer: {self.name}: calls launched eagerly from now on ({why})"
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _settle(self) -> None:
        """Wait for the device before graphs go: a graph freed while a replay of it is in flight would
        hand what it allocated while captured back to the caching allocator too early (rare: evictions
        and turning eager only)."""
        if self.device_type == "cuda" and self.graphs:
            torch.cuda.synchronize()

    def stats(self) -> dict[str, Any]:
        """Captures, replays, evictions, graphs held and why replay is off (None: on)."""
        return {"captures": self.captures, "replays": self.replays, "evictions": self.evictions,
                "graphs": len(self.graphs), "off": self.off}  # fmt: skip


def _eager_only(inputs: tuple, device_type: str) -> bool:
    """Whether this call is launched eagerly: not on ``device_type``, or inside a CUDA graph capture (the
    caller's graph records the launches)."""
    device = getattr(inputs[0], "device", None) if inputs else None
    if device is None or device.type != device_type:
        return True
    return device_type == "cuda" and torch.cuda.is_current_stream_capturing()


_CAPTURE_STREAMS: dict[int, Any] = {}  # device index -> the stream captures run on (bounded: one a GPU)


def capture_cuda_graph(fn: Callable[[], Any], pool: Any = None) -> Any:
    """A ``torch.cuda.CUDAGraph`` of ``fn``'s launches, captured on a private stream of the current device
    (thread-local capture mode: other threads' work is not disturbed; no synchronisation, no cache
    release, unlike ``torch.cuda.graph``), its allocations from ``pool`` (a ``graph_pool_handle``; None: a
    pool of its own). Nothing runs until the graph is replayed."""
    device = torch.cuda.current_device()
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            fn()
        finally:
            graph.capture_end()
    return graph
