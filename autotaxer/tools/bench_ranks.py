"""The set-up the one-call bench scripts share (``bench/calls.py``, ``bench/timeline.py``): this process's
rank joined to the launch's process group (NCCL on its GPU, or gloo on CPU; a single process of its own
when not launched by ``torchrun``), symmetric memory on, and a runtime with no table loaded."""

from __future__ import annotations

import os
from typing import Any


def join_ranks(port: int) -> tuple[Any, bool]:
    """Join (or, outside ``torchrun``, make a one-rank group on ``port``), multicast off; returns the
    default group's runtime, loaded on this rank's device, and whether that device is a GPU."""
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist

    import autotaxer
    from autotaxer.runtime.dispatch import runtime_for

    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        if on_cuda:
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        else:
            dist.init_process_group("gloo")
    if on_cuda:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)
    autotaxer.init(autotaxer.RuntimeConfig(shipped_tables=False, env_tables=False, persist_misses=False))
    rt = runtime_for(None)
    rt.load(torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu"))
    return rt, on_cuda
