"""One variant timed the way the tuner times it and the way a served call runs it, side by side.

    torchrun --nproc-per-node 2 bench/served_vs_trial.py [--op gemm_rs] [--M 4096 --N 8192 --K 8192]
        [--variant copy_engine] [--params '{"streams": 1, "signal": "memop"}'] [--json-out FILE]

Issue 46: on 2xH200 the tuner's confirmation timed ``gemm_rs`` ``copy_engine`` (M=4096 N=8192 K=8192,
scatter_dim 0, nk) at 463 µs while async TP's replay of the same call through ``autotaxer.async_tp`` read
694 µs. Every entry below runs the same variant with the same parameters on the same inputs, in one
:func:`autotaxer.measure.time_interleaved` (chained, link subtracted: what the tuner's confirmation does),
each layer of the served call added one at a time:

* ``trial``: ``variant.run(ws, inputs, ctx, out=out)``, its own workspace, one output reused (the tuner);
* ``fresh_out``: the same with ``out=None`` (a fresh output per call, as served calls get);
* ``serve``: :func:`autotaxer.integrations.autograd.serve` ``(rt, "async_tp", ...)`` with the runtime's
  plan and workspace (decision set to the variant: ``Runtime.serve_decision``);
* ``async_tp``: the kernel ``autotaxer.async_tp`` registers, called on async TP's 3-D input (sizes and
  strides as inductor's calls; the dispatcher hop itself is not in it);
* ``dispatcher``: ``torch.ops.symm_mem.<op>`` with ``autotaxer.async_tp`` enabled: what compiled code and
  the replay call (on gloo the override is registered for the CPU key, as the CPU tests do);
* ``torch``: torch's own fused kernel, called as a function (CUDA only).

Then the replay's timing of ``trial`` and ``async_tp`` (``bench/async_tp_check.py``'s ``_time``: fixed
order, no lead-in call) and, per entry, the host's time to enqueue one call (perf_counter around
``--iters`` calls before the device is synchronised): an entry whose host time per call reaches its
device time is bound by the host, not the GPU. Max over ranks; µs per call. Runs on gloo (CPU) too,
with a CPU variant (``--variant bsp``), as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--op", default="gemm_rs", choices=("gemm_rs", "ag_gemm"))
    p.add_argument("--M", type=int, default=4096)
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--variant", default="copy_engine")
    p.add_argument("--params", default='{"streams": 1, "signal": "memop"}', help="JSON object")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def _host_us(fn: Any, iters: int, on_cuda: bool) -> float:
    """µs per call the host takes to enqueue ``iters`` calls (the device synchronised before and after)."""
    import torch

    if on_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = time.perf_counter() - t0
    if on_cuda:
        torch.cuda.synchronize()
    return host * 1e6 / iters


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.distributed as dist

    import autotaxer
    import autotaxer.async_tp as atp
    from autotaxer._problem import ProblemKey
    from autotaxer.integrations.autograd import serve
    from autotaxer.measure import Chain, maxes_over_ranks, time_interleaved
    from autotaxer.ops import get_op
    from autotaxer.runtime.dispatch import runtime_for
    from autotaxer.runtime.lookup import EXACT, Decision

    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
        if on_cuda:
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        else:
            dist.init_process_group("gloo")
    group = dist.group.WORLD
    if on_cuda:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(group.group_name)
    autotaxer.init(autotaxer.RuntimeConfig(shipped_tables=False, env_tables=False, persist_misses=False))
    rt = runtime_for(None)
    rt.load(torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu"))
    ctx, ws_n = rt.ctx, dist.get_world_size()
    dtype = "fp32" if not on_cuda and args.dtype == "bf16" else args.dtype
    layout = {"scatter_dim": 0} if args.op == "gemm_rs" else {"gather_dim": 0}
    key = ProblemKey.make(
        args.op, ctx.target.gpu_model, ws_n, dtype, {"M": args.M, "N": args.N, "K": args.K},
        {**layout, "b_layout": "nk"},
    )  # fmt: skip
    op = get_op(args.op)
    op.validate(key)
    variant, params = op.variants[args.variant], json.loads(args.params)
    inputs = op.make_inputs(key, ctx.rank, ctx.device, 1234)
    a, b = inputs
    a3 = a.view(a.shape[0], 1, a.shape[1])  # async TP's sequence-parallel (S, batch 1, H) input
    gn = group.group_name

    ws = variant.prepare(key, params, ctx)
    out = op.empty_output(key, ctx.device)
    rt.serve_decision(key, Decision(args.variant, params, EXACT, 0.0, key))
    if args.op == "gemm_rs":
        from autotaxer.ops._torch_symm import matmul_reduce_scatter as torch_rs

        fns = {
            "trial": lambda: variant.run(ws, inputs, ctx, out=out),
            "fresh_out": lambda: variant.run(ws, inputs, ctx),
            "serve": lambda: serve(rt, "async_tp", "gemm_rs", (a, b), layout)[0],
            "async_tp": lambda: atp._matmul_reduce_scatter(a3, b, "sum", 0, gn),
            "dispatcher": lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a3, b, "sum", 0, gn),
            "torch": lambda: torch_rs(a3, b, "sum", 0, gn),
        }
    else:
        from autotaxer.ops._torch_symm import all_gather_matmul as torch_ag

        fns = {
            "trial": lambda: variant.run(ws, inputs, ctx, out=out),
            "fresh_out": lambda: variant.run(ws, inputs, ctx),
            "serve": lambda: serve(rt, "async_tp", "ag_gemm", (a, b), layout)[0],
            "async_tp": lambda: atp._all_gather_matmul(a3, [b], 0, gn, return_A=False)[1][0],
            "dispatcher": lambda: torch.ops.symm_mem.fused_all_gather_matmul(a3, [b], 0, gn, return_A=False)[
                1
            ][0],
            "torch": lambda: torch_ag(a3, [b], 0, gn, return_A=False)[1][0],
        }
    # the dispatcher entry reaches autotaxer's kernel (on gloo registered for the CPU key, as the CPU tests
    # do); the other entries call functions directly
    atp._install("CUDA" if on_cuda else "CPU")
    if not on_cuda:  # torch's fused kernel is CUDA's
        del fns["torch"]
    fns["async_tp"]()  # decides the signature (collective) before any timing
    chains = [Chain(a, out) if name == "trial" else Chain(a) for name in fns]
    got = time_interleaved(
        list(fns.values()), ctx, ("eager",), args.warmup, args.iters, args.samples, chains=chains
    )
    tuner = {name: r.get("eager") for name, r in zip(fns, got, strict=True)}
    link_us = got[0].get("eager_link")
    replayed = [n for n in ("trial", "async_tp", "dispatcher") if n in fns]
    replay = _replay_times({n: fns[n] for n in replayed}, Chain(a), args, ctx, on_cuda)
    host = maxes_over_ranks([_host_us(Chain(a).wrap(fn), args.iters, on_cuda) for fn in fns.values()], ctx)
    served = atp.counters()
    result = {
        "key": key.text, "variant": args.variant, "params": params, "world_size": ws_n,
        "device": torch.cuda.get_device_name() if on_cuda else "cpu",
        "interleaved_us": tuner, "link_us": link_us, "replay_timing_us": replay,
        "host_us_per_call": dict(zip(fns, host, strict=True)), "async_tp_counters": served,
    }  # fmt: skip
    if ctx.rank == 0:
        print(f"# {result['device']} x{ws_n}: {key.text} {args.variant} {params} (µs a call, max over ranks)")
        print(f"{'entry':<10} {'interleaved':>12} {'host':>10}")
        for name in fns:
            t, h = tuner[name], result["host_us_per_call"][name]
            print(f"{name:<10} {'failed' if t is None else f'{t:.1f}':>12} {h:>10.1f}")
        timed = ", ".join(f"{n} {t:.1f}" for n, t in replay.items())
        print(f"link {link_us}; the replay's timing (fixed order, no lead-in call): {timed}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    atp.disable()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _replay_times(fns: dict[str, Any], chain: Any, args: argparse.Namespace, ctx: Any, on_cuda: bool) -> dict:
    """``bench/async_tp_check.py``'s timing: fixed order, a barrier and a synchronisation before each sample,
    no lead-in call, link subtracted; µs, max over ranks."""
    import statistics

    import torch.distributed as dist

    from autotaxer.measure import less_link, maxes_over_ranks

    wrapped = {name: chain.wrap(fn) for name, fn in fns.items()} | {"link": chain.alone()}
    for fn in wrapped.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in wrapped}
    for _ in range(args.samples):
        for name, fn in wrapped.items():
            dist.barrier()
            times[name].append(_timed_us(fn, args.iters, on_cuda))
    meds = maxes_over_ranks([statistics.median(t) for t in times.values()], ctx)
    got = dict(zip(wrapped, meds, strict=True))
    return {name: less_link(got[name], got["link"]) for name in fns}


def _timed_us(fn: Any, iters: int, on_cuda: bool) -> float:
    if not on_cuda:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e6 / iters
    import torch

    from autotaxer.tools.one_rank import ms_per_call

    torch.cuda.synchronize()
    return ms_per_call(fn, iters) * 1e3


if __name__ == "__main__":
    sys.exit(main())
