"""Which NCCL symmetric-memory paths this machine's torch offers (world size = the launched processes).

    torchrun --nproc-per-node N bench/nccl_symm_probe.py

Prints, per path, whether it works and an all-gather's result check: torch's symmetric-memory tensors
with the NCCL backend (``symm_mem.set_backend("NCCL")``, ``empty``, ``rendezvous``), the process
group's ``mem_allocator`` pool, and ``ProcessGroupNCCL._comm_ptr``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.barrier(device_ids=[device.index])
    pg = dist.group.WORLD
    backend = pg._get_backend(device)
    report = {"nccl": torch.cuda.nccl.version(), "torch": torch.__version__}
    report.update(comm_ptr=hasattr(backend, "_comm_ptr"), mem_allocator=None, symm_nccl=None)
    try:
        backend.mem_allocator  # noqa: B018
        report["mem_allocator"] = "ok"
    except Exception as exc:  # noqa: BLE001
        report["mem_allocator"] = f"{type(exc).__name__}: {exc}"
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NCCL")
        send = symm_mem.empty(4096, dtype=torch.bfloat16, device=device)
        recv = symm_mem.empty(4096 * world, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(send, pg.group_name)
        symm_mem.rendezvous(recv, pg.group_name)
        send.fill_(rank + 1)
        dist.all_gather_into_tensor(recv, send)
        torch.cuda.synchronize()
        want = torch.arange(1, world + 1, device=device).repeat_interleave(4096).to(torch.bfloat16)
        report["symm_nccl"] = "ok" if torch.equal(recv, want) else "wrong result"
    except Exception as exc:  # noqa: BLE001
        report["symm_nccl"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(rank, report, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
