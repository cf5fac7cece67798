"""What every rank does for one trial, and the loop of a spawned worker process.

A trial on a rank: prepare (or reuse) the variant's workspace, validate against the reference on two fresh
seeds, agree on the worst error over all ranks (so every rank takes the same branch and no rank waits
alone in a collective), then time with :func:`autotaxer.measure.time_variant` (each call waiting for the
previous one's output unless the timing says ``back-to-back``; a call of milliseconds is timed with fewer
calls a sample, :data:`autotaxer.measure.TRIAL_SAMPLE_US`). A :class:`ConfirmRequest` (the end of a
key's search) times the winner and the forms it is compared with side by side on fresh inputs
(:func:`autotaxer.measure.time_interleaved`). Exceptions become an error reply; on CUDA, an error that
leaves the device unusable (illegal address, ...) also ends the process so that the group is relaunched.
"""

from __future__ import annotations

import math
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from .._problem import ProblemKey
from ..measure import TimingConfig

#: The error of a rank whose trial ended because another rank's raised (that rank names the cause).
PEER_RAISED = "another rank raised (its error names the cause)"


@dataclass(frozen=True)
class TrialRequest:
    """One trial, sent to every rank. ``params`` are the variant's own parameter names."""

    op: str
    key: ProblemKey
    variant: str
    params: dict[str, Any]
    seed: int
    timing: TimingConfig


@dataclass(frozen=True)
class ConfirmRequest:
    """Time ``entries`` (``(variant, params)``: the search's winner and the forms it is compared with)
    side by side on inputs of ``seed`` (a seed no trial used), sent to every rank."""

    op: str
    key: ProblemKey
    entries: tuple[tuple[str, dict[str, Any]], ...]
    seed: int
    timing: TimingConfig


@dataclass(frozen=True)
class RankReply:
    """One rank's answer. ``error`` is a one-line reason (``None`` when the trial ran)."""

    rank: int
    rel_err: float = float("nan")
    tolerance: float = float("nan")
    median_us: float | None = None
    timing_s: float = 0.0
    elapsed_s: float = 0.0
    #: seconds of the workspace's set-up, and of the reference check (the first call: a new configuration
    #: compiles there)
    prepare_s: float = 0.0
    check_s: float = 0.0
    error: str | None = None
    detail: str = ""
    fatal: bool = False
    #: A confirmation's medians, one per entry (None: that entry failed), and the link's cost (µs).
    medians_us: tuple[float | None, ...] = ()
    link_us: float | None = None


@dataclass
class WorkerState:
    """What a rank keeps between trials: its RunContext and the last workspace."""

    ctx: Any  # RunContext
    cached: dict[str, Any] = field(default_factory=dict)

    def workspace(self, variant: Any, key: ProblemKey, params: dict[str, Any]) -> Any:
        ws = self.cached.get(variant.name)
        if ws is not None and ws.matches(key, params):
            return ws
        self.cached.clear()  # one workspace at a time: trials of other shapes/params free theirs
        ws = variant.prepare(key, params, self.ctx)
        self.cached[variant.name] = ws
        return ws


def execute_trial(state: WorkerState, req: TrialRequest | ConfirmRequest) -> RankReply:
    """Run ``req`` on this rank (collective over ``state.ctx.group``).

    Preparing and validating run first on every rank, then the ranks agree, in one collective, on the
    worst error and on whether any rank raised: a rank that raised (a candidate that fails on one rank
    only) still takes part, so its peers leave the trial with it instead of waiting for it in the next
    collective, and every rank takes the same branch.
    """
    from ..measure import TRIAL_SAMPLE_US, Chain, check_variant, maxes_over_ranks, time_variant
    from ..ops import get_op
    from ..runtime.replay import launcher

    if isinstance(req, ConfirmRequest):
        return execute_confirm(state, req)
    ctx = state.ctx
    t0 = time.perf_counter()
    raised: tuple[Exception, str] | None = None
    t_prepared = t_checked = t0
    try:
        op = get_op(req.op)
        variant = op.variants[req.variant]
        ws = state.workspace(variant, req.key, req.params)
        run = launcher(op, variant, req.key, ctx.device)  # as dispatch serves it: graph replays or not
        t_prepared = time.perf_counter()
        err = check_variant(op, variant, req.key, req.params, ctx, req.seed, ws=ws, run=run)
        t_checked = time.perf_counter()
    except Exception as exc:  # reported after the ranks agreed (below)
        raised, err = (exc, traceback.format_exc()), math.inf
    phases = {"prepare_s": t_prepared - t0, "check_s": max(0.0, t_checked - t_prepared)}
    try:
        gave_up = peer_timeout(ctx)  # a kernel's wait on a peer that gave up (check_variant synchronised)
        err, any_raised = maxes_over_ranks([math.inf if gave_up else err, float(raised is not None)], ctx)
        if raised is not None:
            raise raised[0]
        tol = op.tolerance(req.key)
        if gave_up is not None:
            state.cached.clear()  # its flags and epochs no longer match the peers'
            return RankReply(ctx.rank, rel_err=err, tolerance=tol, elapsed_s=time.perf_counter() - t0,
                             error=f"rank {ctx.rank}: {gave_up}")  # fmt: skip
        if any_raised:
            state.cached.clear()
            elapsed = time.perf_counter() - t0
            return RankReply(ctx.rank, elapsed_s=elapsed, error=f"rank {ctx.rank}: {PEER_RAISED}")
        if not err <= tol:  # NaN fails too
            return RankReply(
                ctx.rank,
                rel_err=err,
                tolerance=tol,
                elapsed_s=time.perf_counter() - t0,
                error=f"validation failed: relative error {err:.3g} > tolerance {tol:.3g}",
            )
        inputs = op.make_inputs(req.key, ctx.rank, ctx.device, req.seed)
        out = op.empty_output(req.key, ctx.device)
        t_timing = time.perf_counter()
        median = time_variant(
            lambda: run(ws, inputs, ctx, out=out),
            ctx,
            warmup=req.timing.warmup,
            iters=req.timing.iters,
            mode=req.timing.mode,
            samples=req.timing.samples,
            chain=Chain(inputs[0], out) if req.timing.chain == "dependent" else None,
            sample_us=TRIAL_SAMPLE_US,  # a long call: fewer calls a sample (the confirmation keeps iters)
        )
        t_end = time.perf_counter()
        gave_up = peer_timeout(ctx)  # time_variant synchronised
        if gave_up is not None:
            state.cached.clear()
            return RankReply(ctx.rank, rel_err=err, tolerance=tol, elapsed_s=t_end - t0,
                             error=f"rank {ctx.rank}: {gave_up}")  # fmt: skip
        return RankReply(
            ctx.rank,
            rel_err=err,
            tolerance=tol,
            median_us=median,
            timing_s=t_end - t_timing,
            elapsed_s=t_end - t0,
            **phases,
        )
    except Exception as exc:  # a failed trial, reported to the tuner; the worker lives on
        state.cached.clear()
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return RankReply(
            ctx.rank,
            elapsed_s=time.perf_counter() - t0,
            error=f"rank {ctx.rank}: {type(exc).__name__}: {first_line}",
            detail=raised[1] if raised is not None and exc is raised[0] else traceback.format_exc(),
            fatal=_device_broken(ctx),
        )


def execute_confirm(state: WorkerState, req: ConfirmRequest) -> RankReply:
    """Time ``req.entries`` side by side on this rank (collective): each on its own workspace and output,
    all on the same fresh inputs, chained as ``req.timing`` says. An entry that fails gets None."""
    from ..measure import Chain, time_interleaved
    from ..ops import get_op
    from ..runtime.replay import launcher

    ctx = state.ctx
    t0 = time.perf_counter()
    try:
        state.cached.clear()  # the last trial's workspace goes before the entries' are made
        op = get_op(req.op)
        inputs = op.make_inputs(req.key, ctx.rank, ctx.device, req.seed)
        fns, chains = [], []
        for name, params in req.entries:
            variant = op.variants[name]
            try:
                ws = variant.prepare(req.key, params, ctx)
            except Exception as exc:  # the entry fails in the rounds, on every rank alike
                fns.append(_raising(exc))
                chains.append(None)
                continue
            out = op.empty_output(req.key, ctx.device)
            run = launcher(op, variant, req.key, ctx.device)
            fns.append(lambda r=run, w=ws, o=out: r(w, inputs, ctx, out=o))
            chains.append(Chain(inputs[0], out) if req.timing.chain == "dependent" else None)
        t = req.timing
        times = time_interleaved(fns, ctx, (t.mode,), t.warmup, t.iters, t.samples, chains=chains)
        gave_up = peer_timeout(ctx)
        if gave_up is not None:
            state.cached.clear()
            elapsed = time.perf_counter() - t0
            return RankReply(ctx.rank, elapsed_s=elapsed, error=f"rank {ctx.rank}: {gave_up}")
        links = [r.get(f"{t.mode}_link") for r in times]
        elapsed = time.perf_counter() - t0
        return RankReply(
            ctx.rank,
            timing_s=elapsed,
            elapsed_s=elapsed,
            medians_us=tuple(r.get(t.mode) for r in times),
            link_us=next((v for v in links if v is not None), None),
        )
    except Exception as exc:
        return RankReply(
            ctx.rank,
            elapsed_s=time.perf_counter() - t0,
            error=f"rank {ctx.rank}: {type(exc).__name__}: {exc}"[:300],
            detail=traceback.format_exc(),
            fatal=_device_broken(ctx),
        )


def _raising(exc: Exception) -> Any:
    """A callable that raises ``exc``: an entry whose workspace could not be prepared."""

    def fail() -> None:
        raise exc

    return fail


def peer_timeout(ctx: Any) -> str | None:
    """``PeerTimeoutError: ...`` when a kernel's wait on a peer gave up since the last look (after a
    synchronisation), else None: the trial fails with the op, variant, key and silent peer named."""
    from ..ops._peer_wait import PeerTimeoutError, peer_watch

    try:
        peer_watch(ctx.device).poll()
    except PeerTimeoutError as exc:
        return f"PeerTimeoutError: {exc}"
    return None


def _device_broken(ctx: Any) -> bool:
    """True when the CUDA context no longer works (sticky errors: illegal address, launch failure)."""
    if ctx.target.device_type != "cuda":
        return False
    try:
        import torch

        torch.cuda.synchronize(ctx.device)
        return False
    except Exception:
        return True


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a killed tuner leaves no workers)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends the loop
        pass


def serve(rank: int, world_size: int, port: int, device: str, conn: Any) -> None:
    """Entry point of a spawned worker: init the process group, then answer trials until told to stop."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner handles Ctrl-C and ends its workers
    try:
        from .._launch import init_rank

        ctx = init_rank(rank, world_size, port, device)
        conn.send(("ready", ctx.target))
    except BaseException:
        conn.send(("startup_error", traceback.format_exc()))
        return
    state = WorkerState(ctx)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the tuner is gone
            os._exit(0)
        if msg is None:
            break
        reply = execute_trial(state, msg)
        conn.send(reply)
        if reply.fatal:
            os._exit(3)
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:  # teardown problems do not matter at exit
        pass
