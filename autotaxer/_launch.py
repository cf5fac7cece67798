"""Spawning the ranks of a process group: what the tuner's workers, the benchmark and the tests start.

``run_ranks(fn, world_size, device="cpu"|"cuda", args=(...), timeout=...)`` spawns ``world_size``
processes (spawn start method), initialises ``torch.distributed`` (gloo on CPU, NCCL on CUDA with
``torch.cuda.set_device(rank)``; :func:`init_rank`), calls ``fn(ctx, *args)`` with a
:class:`~autotaxer.ops.RunContext` and returns the per-rank results in rank order. A rank that raises,
dies or outlives ``timeout`` fails the whole call with :class:`RanksFailed` naming the rank and the
reason; no process is left behind. ``fn`` must be importable (a module-level function) and its result
picklable.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

#: Variables that keep NVLink multicast off (the lent multi-GPU machines require it).
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


class RanksFailed(RuntimeError):
    """A rank raised, crashed or timed out."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def share_cpu_cores(ranks_on_host: int) -> int:
    """Size this process's intra-op thread pool to its share of the host's cores and return it.

    Ranks on one CPU host each default to a pool as large as the machine: two ranks on two cores then
    run four spinning threads, and a collective waits for a preempted peer (calls of 0.5 ms took 7.7 ms).
    ``$OMP_NUM_THREADS``, when set, is left in charge.
    """
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // max(1, ranks_on_host))
    torch.set_num_threads(threads)
    return threads


def init_rank(rank: int, world_size: int, port: int, device: str):
    """Initialise the default process group for ``rank`` and return its RunContext (on CPU, with its
    share of the cores: :func:`share_cpu_cores`)."""
    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)
    import torch
    import torch.distributed as dist

    from ._default_group import release_default_group
    from ._target import cpu_target, cuda_target
    from .ops import RunContext

    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        target = cuda_target(rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        target = cpu_target()
        backend = "gloo"
        share_cpu_cores(world_size)
    kwargs = {"device_id": dev} if device == "cuda" else {}
    release_default_group()  # before the group exists: no later import can pin it
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, **kwargs
    )
    return RunContext(rank=rank, world_size=world_size, device=dev, target=target)


def _entry(rank: int, world_size: int, port: int, device: str, fn: Callable, args: tuple, queue) -> None:
    try:
        ctx = init_rank(rank, world_size, port, device)
        result = fn(ctx, *args)
        queue.put((rank, True, result))
    except BaseException:  # report everything, including KeyboardInterrupt, to the parent
        queue.put((rank, False, traceback.format_exc()))
        return
    try:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # teardown problems after a successful result do not fail the run
        pass


def run_ranks(
    fn: Callable[..., Any], world_size: int, device: str = "cpu", args: tuple = (), timeout: float = 300.0
) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` spawned ranks; return results in rank order."""
    import queue as queue_mod
    import time

    import torch.multiprocessing as mp

    mpctx = mp.get_context("spawn")
    q = mpctx.Queue()
    port = free_port()
    procs = [
        mpctx.Process(target=_entry, args=(r, world_size, port, device, fn, args, q), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(results))
                raise RanksFailed(f"ranks {missing} did not finish within {timeout:.0f} s")
            try:
                rank, ok, payload = q.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                for r, p in enumerate(procs):
                    if r not in results and not p.is_alive():
                        raise RanksFailed(f"rank {r} died with exit code {p.exitcode}") from None
                continue
            if not ok:
                raise RanksFailed(f"rank {rank} raised:\n{payload}")
            results[rank] = payload
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return [results[r] for r in range(world_size)]
