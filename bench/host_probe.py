"""Where a copy-engine call's host time goes, and what replaying it as a CUDA graph saves (issue 46).

    torchrun --nproc-per-node 2 bench/host_probe.py [--json-out FILE]

Per op (``ag_gemm`` M=4096 N=5120 K=8192, ``gemm_rs`` M=4096 N=K=8192; bf16, nk), ``copy_engine`` at
its first seed: the host's µs to enqueue one call of each building block (a 1-program Triton flag
kernel, a stream memop, a copy-engine copy, a chunk's vendor GEMM, an event record and wait, a stream
switch), of the whole call, and of the same call captured once into a CUDA graph and replayed; then the
call eager against its graph replay, interleaved and chained (max over ranks), and the replay's output
against the eager call's (bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def _host_us(fn: Any, iters: int = 200) -> float:
    """µs per call the host takes to enqueue ``iters`` calls (``bench/calls.py``'s measure, on CUDA)."""
    from calls import host_us  # bench/ is this script's folder, first on sys.path

    return host_us(fn, iters, on_cuda=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist
    from autotaxer.kernels.common import signal as sig

    import autotaxer
    from autotaxer._problem import ProblemKey
    from autotaxer.measure import maxes_over_ranks
    from autotaxer.runtime.dispatch import runtime_for

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    autotaxer.init(autotaxer.RuntimeConfig(shipped_tables=False, env_tables=False, persist_misses=False))
    rt = runtime_for(None)
    rt.load(torch.device("cuda", torch.cuda.current_device()))
    ctx, ws_n = rt.ctx, dist.get_world_size()
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "world_size": ws_n}
    dev = ctx.device
    flag = torch.full((1,), 1 << 30, dtype=torch.int32, device=dev)
    epoch = torch.zeros(1, dtype=torch.int32, device=dev)
    scratch = torch.zeros(1, dtype=torch.int32, device=dev)
    src = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
    dst = torch.zeros(1 << 20, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream()
    ev = torch.cuda.Event()
    main_s = torch.cuda.current_stream()
    blocks = {
        "advance_epoch (triton)": lambda: sig.advance_epoch(scratch),
        "signal (triton)": lambda: sig.signal(scratch, epoch),
        "wait, raised (triton)": lambda: sig.wait(flag, epoch),
        "memop write": lambda: sig.memop_write(scratch.data_ptr(), 1, main_s),
        "memcpy 1 MiB (driver)": lambda: sig.memcpy_async(dst.data_ptr(), src.data_ptr(), 1 << 20, main_s),
        "event record + wait": lambda: (ev.record(main_s), side.wait_event(ev)),
        "with stream(side)": lambda: _enter_exit(torch.cuda.stream(side)),
    }
    result["blocks_host_us"] = {}
    for name, fn in blocks.items():
        fn()
        result["blocks_host_us"][name] = _host_us(fn)
    result["ops"] = {}
    for op_name, sizes, layout in (
        ("ag_gemm", {"M": 4096, "N": 5120, "K": 8192}, {"gather_dim": 0}),
        ("gemm_rs", {"M": 4096, "N": 8192, "K": 8192}, {"scatter_dim": 0}),
    ):
        shape_layout = {**layout, "b_layout": "nk"}
        key = ProblemKey.make(op_name, ctx.target.gpu_model, ws_n, "bf16", sizes, shape_layout)
        result["ops"][key.text] = _one_op(key, ctx)
    blocks_max = maxes_over_ranks(list(result["blocks_host_us"].values()), ctx)
    result["blocks_host_us"] = dict(zip(result["blocks_host_us"], blocks_max, strict=True))
    if ctx.rank == 0:
        print(f"# {result['device']} x{ws_n}: host µs to enqueue one (max over ranks)")
        for name, us in result["blocks_host_us"].items():
            print(f"{name:<28} {us:8.1f}")
        for k, e in result["ops"].items():
            print(f"## {k} copy_engine {e['params']} replay==eager {e['replay_equals_eager']}")
            for name, us in e["host_us"].items():
                print(f"  host {name:<24} {us:8.1f}")
            for how in ("chained_us", "back_to_back_us"):
                print(f"  {how:<16} " + ", ".join(f"{n} {v}" for n, v in e[how].items()))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _one_op(key: Any, ctx: Any) -> dict[str, Any]:
    """``copy_engine`` at its first seed for ``key``: host µs of a chunk's GEMM, the eager call and its
    graph replay; the two interleaved (chained and back to back); the replay's output against the call's."""
    import torch
    import torch.distributed as dist

    from autotaxer.measure import Chain, maxes_over_ranks, time_interleaved
    from autotaxer.ops import get_op

    op = get_op(key.op)
    variant = op.variants["copy_engine"]
    params = variant.seed_configs(key, ctx.target)[0]
    ws = variant.prepare(key, params, ctx)
    inputs = op.make_inputs(key, ctx.rank, ctx.device, 1234)
    a, b = inputs
    out, out_g = op.empty_output(key, ctx.device), op.empty_output(key, ctx.device)
    chunk = a[:512]
    chunk_out = torch.empty((512, b.shape[-1]), dtype=a.dtype, device=ctx.device)

    def mm() -> Any:
        return torch.matmul(chunk, b, out=chunk_out)

    def eager() -> Any:
        return variant.run(ws, inputs, ctx, out=out)

    for _ in range(3):  # compiles the kernels, makes the handles: nothing a capture may do
        eager()
    torch.cuda.synchronize()
    dist.barrier()
    from autotaxer._capture import gc_paused

    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        variant.run(ws, inputs, ctx, out=out_g)
    torch.cuda.synchronize()
    dist.barrier()
    host = {"chunk GEMM (512 rows)": _host_us(mm, 50), "eager call": _host_us(eager, 50),
            "graph replay": _host_us(graph.replay, 50)}  # fmt: skip
    eager()
    graph.replay()
    torch.cuda.synchronize()
    entry: dict[str, Any] = {"params": params, "replay_equals_eager": bool(torch.equal(out, out_g))}
    chains = [Chain(a, out), Chain(a, out_g)]
    got = time_interleaved([eager, graph.replay], ctx, ("eager",), 5, 20, 9, chains=chains)
    entry["chained_us"] = {"eager": got[0].get("eager"), "graph replay": got[1].get("eager")}
    got = time_interleaved([eager, graph.replay], ctx, ("eager",), 5, 20, 9)
    entry["back_to_back_us"] = {"eager": got[0].get("eager"), "graph replay": got[1].get("eager")}
    entry["host_us"] = dict(zip(host, maxes_over_ranks(list(host.values()), ctx), strict=True))
    return entry


def _enter_exit(cm: Any) -> None:
    cm.__enter__()
    cm.__exit__(None, None, None)


if __name__ == "__main__":
    raise SystemExit(main())
