"""gemm_rs bsp at the layer's keys, 2 GPUs: a loop of 20 (matmul into one buffer + reduce_scatter) timed by
CUDA events on the current stream, the collective waited (the fix) or not (before it), and matmul alone.

Run: ``torchrun --nproc-per-node 2 rs_time.py`` (writes ``$OUT/rs_wait.json``)."""

import json
import os
import statistics

import torch
import torch.distributed as dist

SHAPES = [(4096, 8192, 8192), (4096, 8192, 28672), (4096, 8192, 10240), (4096, 8192, 57344),
          (256, 8192, 8192), (256, 8192, 28672)]  # fmt: skip


def step(mode: str, a, b, part, out) -> None:
    torch.matmul(a, b, out=part)
    if mode == "mm":
        return
    work = dist.reduce_scatter_tensor(out, part, async_op=True)
    if mode == "wait":
        work.wait()


def time_mode(mode: str, *bufs) -> float:
    for _ in range(5):
        step(mode, *bufs)
    torch.cuda.synchronize()
    samples = []
    for _ in range(15):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            step(mode, *bufs)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / 20)
    torch.cuda.synchronize()
    slowest = torch.tensor([statistics.median(samples)], device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def main() -> None:
    dist.init_process_group("nccl")
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    rows = []
    for m, n, k in SHAPES:
        bf16 = {"device": "cuda", "dtype": torch.bfloat16}
        bufs = (torch.randn(m, k // ws, **bf16), torch.randn(k // ws, n, **bf16),
                torch.empty(m, n, **bf16), torch.empty(m // ws, n, **bf16))  # fmt: skip
        res = {}
        for mode in ("mm", "nowait", "wait", "nowait", "wait"):
            res[mode] = time_mode(mode, *bufs)
        rows.append({"M": m, "N": n, "K": k, **res})
    if rank == 0:
        print(f"{'M':>5} {'N':>5} {'K':>6} {'mm us':>8} {'nowait':>8} {'wait':>8}")
        for x in rows:
            print(f"{x['M']:5d} {x['N']:5d} {x['K']:6d} {x['mm']:8.1f} {x['nowait']:8.1f} {x['wait']:8.1f}")
        with open(os.path.join(os.environ.get("OUT", "/tmp"), "rs_wait.json"), "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
