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

from .worker import RankReply, TrialRequest, WorkerState, execute_trial

#: Exit code of a rank ended by the watchdog (the launcher restarts the group).
WATCHDOG_EXIT = 17


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
    from ..testing import NO_MULTICAST_ENV, share_cpu_cores

    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)
    import torch
    import torch.distributed as dist

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
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if device == "cuda" else {}
        dist.init_process_group(backend, init_method="env://", **kwargs)
    return RunContext(rank=launch.rank, world_size=launch.world_size, device=dev, target=target)


class LaunchedGroup:
    """Rank 0's executor inside a launch: broadcast the trial, run it here too, gather the replies."""

    def __init__(self, ctx: Any) -> None:
        self.state = WorkerState(ctx)
        self.launches = 1
        self.launch_s = 0.0
        #: Called with the reason when the watchdog fires, before the process exits (records the trial).
        self.on_abort: Callable[[str], None] | None = None

    def ensure_started(self) -> None:
        pass

    def run(
        self, req: TrialRequest, timeout_s: float, on_wait: Callable[[], None] | None = None
    ) -> list[RankReply]:
        import torch.distributed as dist

        timer = threading.Timer(timeout_s, self._expire, args=(timeout_s,))
        timer.daemon = True
        timer.start()
        try:
            dist.broadcast_object_list([req], src=0)
            reply = execute_trial(self.state, req)
            replies: list[Any] = [None] * self.state.ctx.world_size
            dist.gather_object(reply, replies, dst=0)
        finally:
            timer.cancel()
        return replies

    def _expire(self, timeout_s: float) -> None:
        reason = (
            f"timeout: no result after {timeout_s:g} s (watchdog; exiting so the launcher restarts the group)"
        )
        try:
            if self.on_abort is not None:
                self.on_abort(reason)
        finally:
            os._exit(WATCHDOG_EXIT)

    def stop(self) -> None:
        """Release the followers and leave the process group."""
        import torch.distributed as dist

        dist.broadcast_object_list([None], src=0)
        leave()


def follow(ctx: Any) -> None:
    """Loop of ranks > 0: run each broadcast trial until rank 0 sends None."""
    import torch.distributed as dist

    state = WorkerState(ctx)
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            leave()
            return
        reply = execute_trial(state, box[0])
        dist.gather_object(reply, None, dst=0)


def leave() -> None:
    """Tear the process group down (a process exiting with live gloo/NCCL threads aborts)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
