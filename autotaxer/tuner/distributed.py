"""Tuning inside an existing launch (``torchrun``, SLURM ``srun``): the ranks are already there.

When ``RANK`` and ``WORLD_SIZE`` are set (or SLURM's ``SLURM_PROCID``/``SLURM_NTASKS`` with
``MASTER_ADDR``/``MASTER_PORT``), ``autotaxer tune`` spawns nothing: every process joins the default
process group (``env://``), rank 0 owns the database and the studies, broadcasts each trial with
``broadcast_object_list`` and gathers the replies; the other ranks only follow.

Faults: a watchdog thread on rank 0 records the running trial as failed with its reason (timeout) and
then exits the process with a non-zero code. The launcher sees a failed worker, tears the group down and,
with ``torchrun --max-restarts N``, starts it again; the same command then resumes where it stopped
(finished trials are counted; the trial a crashed peer interrupted is marked failed on resume).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .worker import ConfirmRequest, RankReply, TrialRequest, WorkerState, execute_trial

#: Exit code of a rank ended by the watchdog (the launcher restarts the group).
WATCHDOG_EXIT = 17
#: What rank 0 sends while it waits for something else than a trial (another process's winner): the
#: followers' broadcast completes and they wait again, so no collective outlives the group's timeout.
KEEP_ALIVE = "keep-alive"


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in an existing launch."""

    rank: int
    world_size: int
    local_rank: int


def launch_env(environ: dict[str, str] | None = None) -> LaunchEnv | None:
    """The launch this process runs in (torchrun or SLURM), or None when it was started alone."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, ws = int(env["RANK"]), int(env["WORLD_SIZE"])
        return LaunchEnv(rank, ws, int(env.get("LOCAL_RANK", rank)))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        rank, ws = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        return LaunchEnv(rank, ws, int(env.get("SLURM_LOCALID", rank)))
    return None


def init_launched(launch: LaunchEnv, device: str) -> Any:
    """Join the launch's default process group; this rank's RunContext."""
    from .._launch import NO_MULTICAST_ENV, share_cpu_cores

    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)
    import torch
    import torch.distributed as dist

    from .._default_group import release_default_group
    from .._target import cpu_target, cuda_target
    from ..ops import RunContext

    if device == "cuda":
        visible = torch.cuda.device_count()
        if launch.local_rank >= visible:
            raise RuntimeError(
                f"local rank {launch.local_rank} needs GPU {launch.local_rank}, {visible} visible"
            )
        torch.cuda.set_device(launch.local_rank)
        dev, target, backend = torch.device("cuda", launch.local_rank), cuda_target(launch.local_rank), "nccl"
    else:
        dev, target, backend = torch.device("cpu"), cpu_target(), "gloo"
        share_cpu_cores(int(os.environ.get("LOCAL_WORLD_SIZE", launch.world_size)))
    os.environ.setdefault("RANK", str(launch.rank))
    os.environ.setdefault("WORLD_SIZE", str(launch.world_size))
    release_default_group()  # before the group exists: no later import can pin it
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if device == "cuda" else {}
        dist.init_process_group(backend, init_method="env://", **kwargs)
    return RunContext(rank=launch.rank, world_size=launch.world_size, device=dev, target=target)


class LaunchedGroup:
    """Rank 0's executor inside a launch: broadcast the trial, run it here too, gather the replies.

    ``group``: the process group (None: the default one) whose other ranks run :func:`follow`.
    ``exit_on_timeout``: when a trial outlives its timeout the watchdog records it failed and ends the
    process (``autotaxer tune`` inside torchrun: the launcher restarts the group); False (a model's own
    ranks tuning, :mod:`.in_group`): it only records the trial failed, so no later run
    tries that configuration again. ``before_trial`` is called before each trial (a claim's heartbeat).
    """

    def __init__(self, ctx: Any, group: Any = None, exit_on_timeout: bool = True) -> None:
        self.state = WorkerState(ctx)
        self.group = group
        self.exit_on_timeout = exit_on_timeout
        self.launches = 1
        self.launch_s = 0.0
        #: Called with the reason when the watchdog fires, before the process exits (records the trial).
        self.on_abort: Callable[[str], None] | None = None
        self.before_trial: Callable[[], None] | None = None

    def ensure_started(self) -> None:
        pass

    def run(
        self, req: TrialRequest | ConfirmRequest, timeout_s: float, on_wait: Callable[[], None] | None = None
    ) -> list[RankReply]:
        import torch.distributed as dist

        if self.before_trial is not None:
            self.before_trial()
        timer = threading.Timer(timeout_s, self._expire, args=(timeout_s,))
        timer.daemon = True
        timer.start()
        try:
            if self.state.ctx.world_size == 1:  # nobody to send it to (a group of one, or no process group)
                return [execute_trial(self.state, req)]
            dist.broadcast_object_list([req], src=group_root(self.group), group=self.group)
            reply = execute_trial(self.state, req)
            replies: list[Any] = [None] * self.state.ctx.world_size
            dist.gather_object(reply, replies, dst=group_root(self.group), group=self.group)
        finally:
            timer.cancel()
        return replies

    def _expire(self, timeout_s: float) -> None:
        if not self.exit_on_timeout:
            if self.on_abort is not None:
                self.on_abort(f"timeout: no result after {timeout_s:g} s (watchdog)")
            return
        reason = (
            f"timeout: no result after {timeout_s:g} s (watchdog; exiting so the launcher restarts the group)"
        )
        try:
            if self.on_abort is not None:
                self.on_abort(reason)
        finally:
            os._exit(WATCHDOG_EXIT)

    def keep_alive(self) -> None:
        """Tell the followers rank 0 is still there (between trials, while it waits)."""
        import torch.distributed as dist

        if self.state.ctx.world_size > 1:
            dist.broadcast_object_list([KEEP_ALIVE], src=group_root(self.group), group=self.group)

    def stop(self, leave_group: bool = True) -> None:
        """Release the followers (their :func:`follow` returns) and, with ``leave_group``, leave the group."""
        import torch.distributed as dist

        if self.state.ctx.world_size > 1:
            dist.broadcast_object_list([None], src=group_root(self.group), group=self.group)
        self.state.cached.clear()
        if leave_group:
            leave()


def group_root(group: Any) -> int:
    """The global rank of ``group``'s rank 0 (0 for the default group)."""
    import torch.distributed as dist

    return 0 if group is None else dist.get_global_rank(group, 0)


def follow(ctx: Any, group: Any = None, leave_group: bool = True) -> None:
    """Loop of ranks > 0: run each broadcast trial (:data:`KEEP_ALIVE`: none) until rank 0 sends None (then,
    with ``leave_group``, tear the process group down)."""
    import torch.distributed as dist

    state = WorkerState(ctx)
    root = group_root(group)
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=root, group=group)
        if box[0] is None:
            if leave_group:
                leave()
            return
        if box[0] == KEEP_ALIVE:
            continue
        reply = execute_trial(state, box[0])
        dist.gather_object(reply, None, dst=root, group=group)


def leave() -> None:
    """Tear the process group down (a process exiting with live gloo/NCCL threads aborts)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
