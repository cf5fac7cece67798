"""A spawned worker group: one process per rank, launched once and reused for every trial.

The tuner process owns the study and sends each trial to every rank over a pipe; ranks talk to each
other through ``torch.distributed`` (NCCL on GPUs, gloo on CPU) initialised on a free port of 127.0.0.1.
The watchdog lives in :meth:`SpawnedGroup.run`: a trial that outlives its timeout, a rank that dies
(signal, exit code) or a rank that fails while its peers wait in a collective ends the trial with
:class:`TrialAborted`; the group is then killed and relaunched before the next trial.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from .worker import ConfirmRequest, RankReply, TrialRequest

#: After one rank reports an error, how long its peers get to report theirs before the group is relaunched.
ERROR_GRACE_S = 3.0


class GroupError(RuntimeError):
    """The worker group could not be started (no GPUs, a rank failed to initialise)."""


class TrialAborted(RuntimeError):
    """A trial was ended by the watchdog; ``reason`` says why. The group must be relaunched."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def exit_reason(exitcode: int | None) -> str:
    """Human form of a process exit code: ``killed by signal SIGSEGV (exit code -11)``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


class SpawnedGroup:
    """``world_size`` spawned worker processes on ``device`` (``"cpu"`` or ``"cuda"``)."""

    def __init__(self, world_size: int, device: str, startup_timeout_s: float = 300.0) -> None:
        if world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {world_size}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected cpu or cuda, got {device!r}")
        self.world_size = world_size
        self.device = device
        self.startup_timeout_s = startup_timeout_s
        self.launches = 0
        self.launch_s = 0.0
        self._procs: list[Any] = []
        self._conns: list[Any] = []

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> None:
        """Spawn the ranks and wait until every one has initialised its process group."""
        import torch.multiprocessing as mp

        from .._launch import free_port
        from .worker import serve

        if self.device == "cuda":
            import torch

            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if visible < self.world_size:
                raise GroupError(
                    f"world size {self.world_size} needs {self.world_size} GPUs, {visible} visible"
                )
        self.close()
        t0 = time.monotonic()
        mpctx = mp.get_context("spawn")
        port = free_port()
        for rank in range(self.world_size):
            parent, child = mpctx.Pipe()
            proc = mpctx.Process(
                target=serve, args=(rank, self.world_size, port, self.device, child), daemon=True
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        try:
            self._await_ready(t0 + self.startup_timeout_s)
        except BaseException:
            self.close()
            raise
        self.launches += 1
        self.launch_s += time.monotonic() - t0

    def _await_ready(self, deadline: float) -> None:
        from multiprocessing.connection import wait

        pending = set(range(self.world_size))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GroupError(
                    f"ranks {sorted(pending)} did not initialise within {self.startup_timeout_s:.0f} s"
                )
            ready = wait([self._conns[r] for r in pending], timeout=min(left, 0.5))
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    raise GroupError(
                        f"rank {rank} {exit_reason(self._procs[rank].exitcode)} during start-up"
                    ) from None
                if kind != "ready":
                    raise GroupError(f"rank {rank} failed to start:\n{payload}")
                pending.discard(rank)
            for rank in list(pending):
                proc = self._procs[rank]
                if not proc.is_alive():
                    proc.join(timeout=1)
                    raise GroupError(f"rank {rank} {exit_reason(proc.exitcode)} during start-up")

    def ensure_started(self) -> None:
        """Start the group unless every rank is alive."""
        if not self.alive:
            self.restart()

    def restart(self) -> None:
        """Kill every rank and launch a fresh group."""
        self.close()
        self.start()

    def close(self) -> None:
        """Stop the ranks (politely when idle, otherwise SIGKILL); leaves no process behind."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def kill(self) -> None:
        """SIGKILL every rank at once (hung or crashed group)."""
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def __enter__(self) -> SpawnedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- trials -------------------------------------------------------------------------------------
    def run(
        self,
        req: TrialRequest | ConfirmRequest,
        timeout_s: float,
        on_wait: Callable[[], None] | None = None,
        wait_every_s: float = 5.0,
    ) -> list[RankReply]:
        """Send ``req`` to every rank and return their replies in rank order (the watchdog).

        Raises :class:`TrialAborted` (after killing the group) when the trial times out, a rank dies, or a
        rank fails while the others do not answer within :data:`ERROR_GRACE_S`. ``on_wait`` is called
        every ``wait_every_s`` seconds while waiting (heartbeats).
        """
        from multiprocessing.connection import wait

        self.ensure_started()
        for conn in self._conns:
            conn.send(req)
        start = time.monotonic()
        deadline = start + timeout_s
        next_beat = start + wait_every_s
        replies: dict[int, RankReply] = {}
        first_error: tuple[float, RankReply] | None = None
        while len(replies) < self.world_size:
            now = time.monotonic()
            waiting = [c for r, c in enumerate(self._conns) if r not in replies]
            sentinels = [p.sentinel for r, p in enumerate(self._procs) if r not in replies]
            ready = wait(waiting + sentinels, timeout=max(0.0, min(0.2, deadline - now)))
            for conn in ready:
                if conn in waiting and conn.poll():
                    try:
                        reply = conn.recv()
                    except (EOFError, OSError):
                        continue  # the process died; its sentinel reports it below
                    replies[reply.rank] = reply
                    if reply.error and first_error is None:
                        first_error = (time.monotonic(), reply)
            dead = [r for r, p in enumerate(self._procs) if r not in replies and not p.is_alive()]
            if dead:
                rank = dead[0]
                self._procs[rank].join(timeout=1)
                reason = f"rank {rank} {exit_reason(self._procs[rank].exitcode)}"
                self.kill()
                raise TrialAborted(f"crash: {reason}")
            now = time.monotonic()
            if len(replies) < self.world_size and first_error and now - first_error[0] > ERROR_GRACE_S:
                missing = sorted(set(range(self.world_size)) - set(replies))
                self.kill()
                raise TrialAborted(f"{first_error[1].error} (ranks {missing} stopped answering)")
            if len(replies) < self.world_size and now >= deadline:
                missing = sorted(set(range(self.world_size)) - set(replies))
                self.kill()
                raise TrialAborted(f"timeout: no result after {timeout_s:g} s (ranks {missing} hung)")
            if on_wait is not None and now >= next_beat:
                on_wait()
                next_beat = now + wait_every_s
        if any(r.fatal for r in replies.values()):
            self.kill()  # fatal ranks exit on their own; the next trial relaunches
        return [replies[r] for r in range(self.world_size)]
