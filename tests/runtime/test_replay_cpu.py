"""Calls launched as graph replays (:mod:`autotaxer.runtime.replay`), on CPU with a stand-in for CUDA graphs
that records the captured call and repeats it with the captured arguments, as a CUDA graph repeats its
launches on the captured addresses: every call's output must still be its own inputs' product (values
changed in place, new tensors, two results kept), the argument sets that stop repeating and the capture
that fails fall back to eager calls, and dispatch, the tuner and ``autotaxer bench`` launch through
:func:`launcher`."""

from __future__ import annotations

import pytest
import torch

from autotaxer.runtime import replay
from autotaxer.runtime.replay import ReplayedRun, launcher


class _Graph:
    """A captured call: ``replay()`` runs it again with the arguments it was captured with."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def replay(self) -> None:
        self.fn()


class _Calls:
    """A variant's ``run`` (``out = a @ b``) that counts its launches. Under :meth:`capture` its host code
    runs and launches nothing (the graph launches at replay); ``fail`` makes a capture raise."""

    def __init__(self) -> None:
        self.launches = 0
        self.capturing = False
        self.fail = False

    def run(self, ws, inputs, ctx, out=None):
        a, b = inputs
        if out is None:
            out = torch.empty(a.shape[0], b.shape[1])
        if self.capturing:
            if self.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            return out
        torch.matmul(a, b, out=out)
        self.launches += 1
        return out

    def capture(self, fn):
        self.capturing = True
        try:
            fn()
        finally:
            self.capturing = False
        return _Graph(fn)


def _capture_host(fn):
    fn()
    return _Graph(fn)


def _replayed(calls: _Calls, limit: int = 8) -> ReplayedRun:
    return ReplayedRun(calls.run, (4, 3), torch.float32, limit, capture=calls.capture, device_type="cpu")


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 5, generator=g), torch.randn(5, 3, generator=g)


def test_one_argument_set_is_captured_once_and_replays_the_current_values():
    calls = _Calls()
    run = _replayed(calls)
    a, b = _inputs(0)
    out = torch.empty(4, 3)
    for i in range(4):
        a.copy_(_inputs(i)[0])  # new values, same tensors: the replay reads them
        got = run("ws", (a, b), None, out)
        assert got is out
        torch.testing.assert_close(got, a @ b)
    assert (run.captures, run.replays, calls.launches) == (1, 3, 4)  # the first call eager


def _warm(run: ReplayedRun) -> ReplayedRun:
    """``run`` after its first call (launched eagerly)."""
    a, b = _inputs(100)
    torch.testing.assert_close(run("warm", (a, b), None), a @ b)
    assert (run.captures, run.replays, run.warm) == (0, 0, True)
    return run


def test_two_calls_with_both_results_kept_get_their_own_outputs():
    calls = _Calls()
    run = _warm(_replayed(calls))
    a1, b = _inputs(1)
    first = run("ws", (a1, b), None)
    a2 = _inputs(2)[0]
    second = run("ws", (a2, b), None)  # first is alive: a fresh output elsewhere, a graph of its own
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, a1 @ b)
    torch.testing.assert_close(second, a2 @ b)
    assert run.captures == 2


def test_workspace_shape_strides_and_dtype_are_part_of_the_argument_set():
    calls = _Calls()
    run = _warm(_replayed(calls))
    a, b = _inputs(3)
    out = torch.empty(4, 3)
    run("ws1", (a, b), None, out)
    run("ws2", (a, b), None, out)  # another workspace: its own graph
    bt = b.t().contiguous().t()  # same values, other strides and address
    torch.testing.assert_close(run("ws1", (a, bt), None, out), a @ b)
    assert run.captures == 3


def test_argument_sets_that_never_repeat_turn_replay_off():
    calls = _Calls()
    run = _warm(_replayed(calls, limit=2))
    kept = []
    for i in range(8):  # every call new tensors (all kept alive: new addresses)
        a, b = _inputs(10 + i)
        kept.append((a, b, run("ws", (a, b), None)))
    assert run.off is not None and "do not repeat" in run.off
    assert run.graphs == {}
    captured = run.captures
    a, b = _inputs(99)
    torch.testing.assert_close(run("ws", (a, b), None), a @ b)  # eager from now on
    assert run.captures == captured
    for a, b, got in kept:
        torch.testing.assert_close(got, a @ b)


def test_a_capture_that_fails_falls_back_to_eager_calls():
    calls = _Calls()
    run = _replayed(calls)
    run.name = "ag_gemm|cpu copy_engine"
    _warm(run)
    calls.fail = True
    a, b = _inputs(4)
    warned = r"ag_gemm\|cpu copy_engine: calls launched eagerly .*capture failed"
    with pytest.warns(RuntimeWarning, match=warned):
        torch.testing.assert_close(run("ws", (a, b), None), a @ b)
    assert run.off is not None and "capture failed" in run.off
    calls.fail = False
    torch.testing.assert_close(run("ws", (a, b), None), a @ b)
    assert run.captures == 0


def test_a_variant_returning_another_tensor_is_not_replayed():
    def run_fresh(ws, inputs, ctx, out=None):
        a, b = inputs
        return a @ b  # ignores out=: a graph of it would leave the caller's output unwritten

    run = _warm(ReplayedRun(run_fresh, (4, 3), torch.float32, 8, capture=_capture_host, device_type="cpu"))
    a, b = _inputs(5)
    torch.testing.assert_close(run("ws", (a, b), None), a @ b)
    assert run.off is not None and run.replays == 0


def test_inputs_on_another_device_type_are_launched_eagerly():
    calls = _Calls()
    run = ReplayedRun(calls.run, (4, 3), torch.float32, 8, capture=calls.capture, device_type="cuda")
    a, b = _inputs(6)
    torch.testing.assert_close(run("ws", (a, b), None), a @ b)
    assert (run.captures, run.replays, run.off) == (0, 0, None)


def test_the_launcher_replays_listed_variants_on_cuda_only(monkeypatch):
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op

    op = get_op("ag_gemm")
    key = ProblemKey.make("ag_gemm", "nvidia-h200", 2, "bf16", {"M": 64, "N": 48, "K": 32}, {"gather_dim": 0})
    ce, bsp = op.variants["copy_engine"], op.variants["bsp"]
    assert "copy_engine" in op.replayed and "bsp" not in op.replayed
    run = launcher(op, ce, key, torch.device("cuda"))
    assert isinstance(run, ReplayedRun)
    assert (run.out_shape, run.out_dtype) == ((64, 48), torch.bfloat16)
    assert launcher(op, bsp, key, torch.device("cuda")) == bsp.run
    assert launcher(op, ce, key, torch.device("cpu")) == ce.run
    monkeypatch.setenv(replay.REPLAY_ENV, "0")
    assert launcher(op, ce, key, torch.device("cuda")) == ce.run


def test_torch_fused_is_replayed_in_both_ops():
    """Torch's fused ops (host time of 300-450 us a call at 4 ranks) are served as the graph-timed trials
    timed them: replayed, in ``ag_gemm`` and ``gemm_rs`` alike; ``bsp`` never is."""
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op

    keys = {
        "ag_gemm": ({"M": 64, "N": 48, "K": 32}, {"gather_dim": 0}),
        "gemm_rs": ({"M": 64, "N": 48, "K": 32}, {"scatter_dim": 0}),
    }
    for name, (shape, layout) in keys.items():
        op = get_op(name)
        key = ProblemKey.make(name, "nvidia-h200", 2, "bf16", shape, layout)
        assert "torch_fused" in op.replayed and "bsp" not in op.replayed, name
        assert isinstance(launcher(op, op.variants["torch_fused"], key, torch.device("cuda")), ReplayedRun)


def test_limit_must_be_positive():
    with pytest.raises(ValueError, match="limit"):
        ReplayedRun(lambda *a: None, (1,), torch.float32, 0)


class _Recorded:
    """A stand-in for :func:`launcher` replaying every variant on CPU (``_Calls``-style capture of the
    variant's own ``run``); ``made`` lists the :class:`ReplayedRun` it handed out."""

    def __init__(self) -> None:
        self.made: list[ReplayedRun] = []

    def __call__(self, opobj, variant, key, device, limit=8, name=None):
        spec = opobj.empty_output(key, "meta")
        run = ReplayedRun(variant.run, tuple(spec.shape), spec.dtype, limit, capture=_capture_host,
                          device_type="cpu", name=name)  # fmt: skip
        self.made.append(run)
        return run


def test_dispatch_serves_through_the_launcher(monkeypatch):
    import autotaxer
    import autotaxer.runtime.dispatch as dispatch_mod
    import autotaxer.runtime.workspaces as workspaces_mod

    recorded = _Recorded()
    monkeypatch.setattr(workspaces_mod, "launcher", recorded)
    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    try:
        a, b = torch.randn(8, 6), torch.randn(6, 5)
        first = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        second = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)  # both kept: two outputs, two graphs
        torch.testing.assert_close(first, a @ b)
        torch.testing.assert_close(second, a @ b)
        (run,) = recorded.made
        assert run.replays == 1 and first.data_ptr() != second.data_ptr()  # the first call eager
    finally:
        dispatch_mod.shutdown()


def test_the_tuners_trials_and_confirmations_launch_through_the_launcher(monkeypatch):
    from _factories import FAST, KEY, InlineExecutor

    from autotaxer.tuner.worker import ConfirmRequest, TrialRequest

    recorded = _Recorded()
    monkeypatch.setattr(replay, "launcher", recorded)
    executor = InlineExecutor()
    (reply,) = executor.run(TrialRequest("ag_gemm", KEY, "bsp", {}, 3, FAST), 60)
    assert reply.error is None and reply.rel_err < 1e-5
    (trial_run,) = recorded.made
    assert trial_run.replays >= 2  # two validation seeds (the first eager), then the timed calls
    (reply,) = executor.run(ConfirmRequest("ag_gemm", KEY, (("bsp", {}), ("bsp", {})), 5, FAST), 60)
    assert reply.error is None and len(reply.medians_us) == 2
    assert len(recorded.made) == 3 and all(r.replays >= 1 for r in recorded.made[1:])


def test_the_benchs_variant_entries_launch_through_the_launcher(monkeypatch):
    """``autotaxer bench`` times a variant as dispatch serves it: validated and timed through
    :func:`launcher` (replayed from its second call), its output the product, ``launch`` naming how."""
    from _factories import KEY

    from autotaxer._target import cpu_target
    from autotaxer.benchmark.case import BenchConfig
    from autotaxer.benchmark.entries import variant_entry
    from autotaxer.benchmark.timing import RowTimings
    from autotaxer.ops import RunContext, get_op

    recorded = _Recorded()
    monkeypatch.setattr(replay, "launcher", recorded)
    ctx = RunContext(rank=0, world_size=1, device=torch.device("cpu"), target=cpu_target(), warmed_up=True)
    op = get_op("ag_gemm")
    cfg = BenchConfig(cases=(), world_size=1, device="cpu", max_configs=1, warmup=1, iters=2, samples=2)
    inputs = op.make_inputs(KEY, 0, ctx.device, cfg.seed)
    timings = RowTimings()
    entry = variant_entry(op, op.variants["cpu_chunked"], KEY, ctx, inputs, cfg, None, timings)
    timings.run(ctx, cfg)
    assert entry["launch"] == "eager" and not entry["failed"], entry  # replayable on CUDA only
    assert entry["err"] < 1e-5 and entry["eager"] > 0
    (run,) = recorded.made
    assert run.replays >= 2  # the validation's second seed, the sweep's and the row's timed calls


def test_a_key_switched_between_forms_keeps_each_workspaces_graphs(monkeypatch):
    """The in-step check switches a key between its winner and its fastest form, step after step: each
    workspace keeps its launcher, so a switch back replays the graphs captured before (a launcher made
    anew would launch its first call eagerly and capture again: the check would time that)."""
    import autotaxer
    import autotaxer.runtime.dispatch as dispatch_mod
    import autotaxer.runtime.workspaces as workspaces_mod
    from autotaxer.ops import get_op
    from autotaxer.runtime.lookup import EXACT, Decision

    recorded = _Recorded()
    monkeypatch.setattr(workspaces_mod, "launcher", recorded)
    rt = autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    try:
        a, b = torch.randn(8, 6), torch.randn(6, 5)
        out = torch.empty(8, 5)
        autotaxer.dispatch("ag_gemm", a, b, gather_dim=0, out=out)
        key = rt.plan("ag_gemm", a, b, gather_dim=0).key
        op = get_op("ag_gemm")
        forms = {}
        for name in ("cpu_chunked", "bsp"):
            params = op.variants[name].default_params(key, rt.ctx.target)
            forms[name] = Decision(name, params, EXACT, 0.0, key)
        for _ in range(3):
            for name in ("cpu_chunked", "bsp"):
                rt.serve_decision(key, forms[name])
                out.fill_(float("nan"))
                torch.testing.assert_close(autotaxer.dispatch("ag_gemm", a, b, gather_dim=0, out=out), a @ b)
        by_variant = {}
        for run in recorded.made:
            by_variant.setdefault(run.run.__self__.name, []).append(run)
        assert {n: len(r) for n, r in by_variant.items()} == {"cpu_chunked": 1, "bsp": 1}
        for runs in by_variant.values():
            assert runs[0].captures == 1  # one argument set, captured once across the switches
        stats = {row["variant"]: row for row in rt.launch_stats()}  # what a benchmark prints
        assert set(stats) == {"cpu_chunked", "bsp"} and stats["bsp"]["key"] == key.text
        assert all(row["captures"] == 1 and row["off"] is None for row in stats.values())
    finally:
        dispatch_mod.shutdown()


def _pair_run(ws, inputs, ctx, out=None):
    """A saving call's stand-in: ``(a @ b, a)``, into ``out`` (a pair) when given."""
    a, b = inputs
    if out is None:
        out = (torch.empty(a.shape[0], b.shape[1]), torch.empty_like(a))
    c, saved = out
    torch.matmul(a, b, out=c)
    saved.copy_(a)
    return c, saved


def test_an_output_pair_is_learned_from_the_first_call_and_each_call_gets_its_own():
    run = ReplayedRun(_pair_run, None, None, 8, capture=_capture_host, device_type="cpu")
    a0, b = _inputs(20)
    c, saved = run("ws", (a0, b), None)  # eager: the pair's shapes and dtypes learned
    assert (run.out_shape, run.out_dtype) == (((4, 3), (4, 5)), (torch.float32, torch.float32))
    kept = []
    for i in range(3):  # every result kept: fresh pairs, each captured once
        a = _inputs(21 + i)[0]
        kept.append((a, run("ws", (a, b), None)))
    for a, (c, saved) in kept:
        torch.testing.assert_close(c, a @ b)
        torch.testing.assert_close(saved, a)
    assert len({c.data_ptr() for _, (c, _) in kept}) == 3 and run.captures == 3
    pair, a = (torch.empty(4, 3), torch.empty(4, 5)), torch.empty(4, 5)
    for i in range(3):  # one pair and input reused, new values: captured once, then replayed
        a.copy_(_inputs(30 + i)[0])
        got = run("ws", (a, b), None, pair)
        assert got[0] is pair[0] and got[1] is pair[1]
        torch.testing.assert_close(pair[0], a @ b)
        torch.testing.assert_close(pair[1], a)
    assert run.captures == 4 and run.replays == 6 and run.off is None


def test_a_pair_run_returning_other_tensors_is_not_replayed():
    def fresh_pair(ws, inputs, ctx, out=None):
        return _pair_run(ws, inputs, ctx, None)  # ignores out=

    run = ReplayedRun(fresh_pair, None, None, 8, capture=_capture_host, device_type="cpu")
    a, b = _inputs(40)
    run("ws", (a, b), None)
    c, saved = run("ws", (a, b), None)
    torch.testing.assert_close(c, a @ b)
    assert run.off is not None and run.replays == 0


def test_the_saving_launcher_replays_only_variants_that_hand_out_into_a_pair(monkeypatch):
    from autotaxer.ops import get_op
    from autotaxer.runtime.replay import saving_launcher

    op = get_op("ag_gemm")
    ce, fanout, bsp = op.variants["copy_engine"], op.variants["ce_fanout"], op.variants["bsp"]
    cuda = torch.device("cuda")
    run = saving_launcher(op, ce, cuda, name="k copy_engine (saving)")
    assert isinstance(run, ReplayedRun) and run.out_dtype is None and run.name.endswith("(saving)")
    assert saving_launcher(op, bsp, cuda) == bsp.run_for_backward  # not replayed
    assert saving_launcher(op, fanout, cuda) == fanout.run_for_backward  # replayed, but hands nothing out
    assert saving_launcher(op, ce, torch.device("cpu")) == ce.run_for_backward
    monkeypatch.setenv(replay.REPLAY_ENV, "0")
    assert saving_launcher(op, ce, cuda) == ce.run_for_backward


class _RecordedSaving:
    """A stand-in for :func:`saving_launcher` replaying every variant's saving calls on CPU (its
    ``run_for_backward`` copied into the pair a replay writes)."""

    def __init__(self) -> None:
        self.made: list[ReplayedRun] = []

    def __call__(self, opobj, variant, device, limit=8, name=None):
        def run_pair(ws, inputs, ctx, out=None):
            c, saved = variant.run_for_backward(ws, inputs, ctx)
            if out is None:
                return c, saved
            out[0].copy_(c)
            out[1].copy_(saved)
            return out

        run = ReplayedRun(run_pair, None, None, limit, capture=_capture_host, device_type="cpu", name=name)
        self.made.append(run)
        return run


def test_calls_that_keep_the_gathered_a_are_served_through_the_saving_launcher(monkeypatch):
    """Training steps (B requires grad: the gathered A saved for its gradient) go through the saving
    launcher: replayed from the second step on, gradients plain PyTorch's, two forwards kept alive too."""
    import autotaxer
    import autotaxer.runtime.dispatch as dispatch_mod
    import autotaxer.runtime.workspaces as workspaces_mod

    recorded = _RecordedSaving()
    monkeypatch.setattr(workspaces_mod, "saving_launcher", recorded)
    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    try:
        a = torch.randn(8, 6)
        w = torch.randn(6, 5, requires_grad=True)
        for _ in range(3):
            w.grad = None
            autotaxer.dispatch("ag_gemm", a, w, gather_dim=0).square().sum().backward()
            torch.testing.assert_close(w.grad, a.t() @ (2 * (a @ w.detach())))
        (run,) = recorded.made
        assert run.replays >= 1 and run.name.endswith("(saving)")
        w.grad = None
        a2 = torch.randn(8, 6)
        first = autotaxer.dispatch("ag_gemm", a, w, gather_dim=0)
        second = autotaxer.dispatch("ag_gemm", a2, w, gather_dim=0)
        (first.sum() + 2 * second.sum()).backward()
        ones = torch.ones(8, 5)
        torch.testing.assert_close(w.grad, a.t() @ ones + 2 * a2.t() @ ones)
    finally:
        dispatch_mod.shutdown()


def test_a_key_switched_between_forms_keeps_its_saving_calls_graphs(monkeypatch):
    """The in-step check switches a key between forms step after step; its training calls' launcher is kept
    per workspace like the plain calls', so a switch back replays what was captured (a launcher made anew
    per switch would run its first call eagerly and capture the next inside the timed step)."""
    import autotaxer
    import autotaxer.runtime.dispatch as dispatch_mod
    import autotaxer.runtime.workspaces as workspaces_mod
    from autotaxer.ops import get_op
    from autotaxer.runtime.lookup import EXACT, Decision

    recorded = _RecordedSaving()
    monkeypatch.setattr(workspaces_mod, "saving_launcher", recorded)
    rt = autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    try:
        a = torch.randn(8, 6)
        w = torch.randn(6, 5, requires_grad=True)
        autotaxer.dispatch("ag_gemm", a, w.detach(), gather_dim=0)
        key = rt.plan("ag_gemm", a, w.detach(), gather_dim=0).key
        op = get_op("ag_gemm")
        forms = {}
        for name in ("cpu_chunked", "bsp"):  # cpu_chunked hands nothing out: its training calls run bsp's
            params = op.variants[name].default_params(key, rt.ctx.target)
            forms[name] = Decision(name, params, EXACT, 0.0, key)
        for _ in range(3):
            for name in ("cpu_chunked", "bsp"):
                rt.serve_decision(key, forms[name])
                w.grad = None
                autotaxer.dispatch("ag_gemm", a, w, gather_dim=0).sum().backward()
                torch.testing.assert_close(w.grad, a.t() @ torch.ones(8, 5))
        (run,) = recorded.made  # one launcher for bsp's saving calls, across six switches
        assert run.replays == 5  # only the very first call eager (CPU addresses vary: captures may too)
        stats = {row["variant"]: row for row in rt.launch_stats()}  # what a benchmark prints
        assert stats["bsp (saving)"]["replays"] == 5 and stats["bsp (saving)"]["key"] == key.text
    finally:
        dispatch_mod.shutdown()


def test_every_graph_of_one_run_allocates_from_one_pool_and_runs_have_their_own(monkeypatch):
    """What a variant allocates inside a captured call (``torch_fused``: torch's op returns a fresh
    product) is held once per run, not once per argument set: every capture of a run gets its pool."""
    pools: list = []
    made = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool", next(made)))

    def capture(fn, pool=None):
        pools.append(pool)
        return _capture_host(fn)

    monkeypatch.setattr(replay, "capture_cuda_graph", capture)
    calls = _Calls()
    runs = [_warm(ReplayedRun(calls.run, (4, 3), torch.float32, 8, device_type="cpu")) for _ in range(2)]
    for run in runs:
        for seed in range(3):  # three argument sets: three captures
            a, b = _inputs(seed)
            torch.testing.assert_close(run("ws", (a, b), None, torch.empty(4, 3)), a @ b)
    assert pools == [("pool", 0)] * 3 + [("pool", 1)] * 3


def test_a_replayed_run_is_freed_when_its_last_reference_goes_not_by_the_cyclic_collector() -> None:
    """A run (and the graphs it holds) must not sit in a reference cycle: the cyclic collector would free
    it at any moment, e.g. during another capture, where freeing a CUDA graph is not permitted (2xH200:
    a failed graph reset, then a segmentation fault in a replay)."""
    import gc
    import weakref

    from autotaxer._capture import gc_paused

    with gc_paused():
        run = ReplayedRun(_Calls().run, (4, 3), torch.float32, 4, device_type="cuda")
        gone = weakref.ref(run)
        del run
        assert gone() is None  # freed by its reference count, the collector off
    assert gc.isenabled()


def test_the_collector_is_paused_inside_and_restored_after_even_on_error() -> None:
    import gc

    from autotaxer._capture import gc_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="capture failed"):
        with gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_the_cuda_capture_runs_the_call_with_the_collector_paused(monkeypatch) -> None:
    """:func:`capture_cuda_graph` (every replayed call's capture) runs the captured call with the cyclic
    collector off; CUDA's graph and stream are stand-ins here."""
    import contextlib
    import gc

    class FakeGraph:
        def capture_begin(self, pool=None, capture_error_mode="global") -> None:
            assert capture_error_mode == "thread_local"

        def capture_end(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: object())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(replay, "_CAPTURE_STREAMS", {})
    seen: list[bool] = []
    graph = replay.capture_cuda_graph(lambda: seen.append(gc.isenabled()))
    assert isinstance(graph, FakeGraph) and seen == [False] and gc.isenabled()


def test_while_eager_calls_holds_calls_launch_eagerly_and_the_graphs_wait_for_after():
    """``eager_calls`` (the in-step check's graph-timed steps): no capture and no replay inside, each call
    launched and right; the graph captured before is replayed again after, and nested holds nest."""
    from autotaxer.runtime.replay import eager_calls

    calls = _Calls()
    run = _replayed(calls)
    a, b = _inputs(7)
    out = torch.empty(4, 3)
    run("ws", (a, b), None, out)  # eager (the first call)
    run("ws", (a, b), None, out)  # captured and replayed (the stand-in graph's replay runs the call)
    assert (run.captures, run.replays, calls.launches) == (1, 1, 2)
    with eager_calls():
        with eager_calls():
            a.copy_(_inputs(8)[0])
            torch.testing.assert_close(run("ws", (a, b), None, out), a @ b)
        fresh = run("ws", (a, b), None)  # no out: a fresh output, launched eagerly
        torch.testing.assert_close(fresh, a @ b)
    assert (run.captures, run.replays, calls.launches) == (1, 1, 4)
    assert len(run.graphs) == 1 and run.off is None
    run("ws", (a, b), None, out)
    assert (run.captures, run.replays, calls.launches) == (1, 2, 5)
