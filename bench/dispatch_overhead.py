"""Host overhead of ``autotaxer.dispatch`` over calling the chosen variant's ``run`` directly.

Two measures, both per call (µs):

- ``insitu_overhead``: dispatch runs the real variant, whose ``run`` is wrapped in a probe that reads
  the clock on entry and exit, so ``overhead = time of dispatch() - time inside run``: the variant's
  own time and jitter cancel out, but dispatch runs right after the variant's launch (caches cold, as
  in a model). The probe's own cost (a Python call and two clock reads) is measured the same way
  around a direct call and reported as ``probe``; ``insitu_overhead`` includes it (an upper bound).
- ``isolated_overhead``: the plan's ``run`` is a no-op returning ``out``; calls alternate dispatch and
  the no-op called directly, each timed alone, and the sample is their difference: no launch, so no
  cache pollution or launch jitter. ``isolated_loop`` is the same difference from back-to-back loops
  of ``--loop`` calls (mean per call, no clock reads per call; p50 over the loops).

``--mode compiled`` measures instead what a served call costs the host from compiled code: per call,
the custom ops ``torch.ops.autotaxer.ag_gemm`` / ``gemm_rs`` in a ``torch.compile(fullgraph=True)``
function against the same function written as plain PyTorch (``all_gather_tensor`` + matmul, matmul +
``reduce_scatter_tensor``: what a traced BSP holds), both serving the same problem (no table: the custom
op serves ``bsp``, whose eager all-gather and matmul are the same work), plus ``Runtime.dispatch`` and the
custom op called eagerly; interleaved rounds of ``--loop`` calls, p50 over rounds of the mean per call.

Also reported: the paired difference of whole real calls (dispatch vs direct, alternating), what
``out=None`` costs the variant (the caching-allocator allocation of the output) against a
preallocated ``out``, and the host (CPU model, core counts: the overhead depends on them).

    python bench/dispatch_overhead.py --device cpu                      # 1 process, CPU
    python bench/dispatch_overhead.py --device cuda --world-size 2      # 2 GPUs (NCCL), rank 0 reports
    python bench/dispatch_overhead.py --mode compiled --device cpu      # compiled custom op vs funcol

GPU host times are launch times (the GPU runs behind; the queue is drained every 256 calls, untimed).
Writes JSON to ``--json`` (default ``dispatch_overhead_<device>_ws<N>_<date>.json`` in the working folder:
a run's folder under ``bench/results/`` gets it with a summary) and prints p50/p99 in µs.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _summary(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)

    def q(f: float) -> float:
        return s[min(len(s) - 1, int(f * len(s)))] / 1e3

    return {"p50_us": q(0.50), "p90_us": q(0.90), "p99_us": q(0.99), "mean_us": statistics.fmean(s) / 1e3}


def _host() -> dict[str, Any]:
    """CPU model and core counts of this host (``/proc/cpuinfo`` where there is one)."""
    import os

    host: dict[str, Any] = {"machine": platform.machine(), "os_cpu_count": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        host["usable_cpus"] = len(os.sched_getaffinity(0))
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        host["cpu_model"] = platform.processor() or None
        return host
    models, cores, logical = [], set(), 0
    phys = core = None
    for line in text.splitlines() + [""]:
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name == "processor":
            logical += 1
        elif name == "model name":
            models.append(value)
        elif name == "physical id":
            phys = value
        elif name == "core id":
            core = value
        elif not name:  # blank line: end of one processor's block
            if core is not None:
                cores.add((phys, core))
            phys = core = None
    host["cpu_model"] = max(set(models), key=models.count) if models else platform.processor() or None
    host["logical_cpus"] = logical
    host["physical_cores"] = len(cores) if cores else None
    host["sockets"] = len({p for p, _ in cores}) if cores else None
    return host


def _isolated(dispatch: Any, plan: Any, a: Any, b: Any, out: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Dispatch through ``plan`` with a no-op ``run`` against that no-op called directly."""
    clock = time.perf_counter_ns
    gd = args.gather_dim
    real_run = plan.run

    def noop(w, inputs, c, o):
        return o

    ws, rctx, inputs = plan.workspace, plan.ctx, (a, b)
    plan.run = noop
    try:
        for _ in range(args.warmup):
            dispatch("ag_gemm", a, b, gather_dim=gd, out=out)
            noop(ws, inputs, rctx, out)
        gc.collect()
        per_call, disp, direct = [], [], []
        for _ in range(args.iters):
            t0 = clock()
            dispatch("ag_gemm", a, b, gather_dim=gd, out=out)
            t1 = clock()
            noop(ws, inputs, rctx, out)
            t2 = clock()
            disp.append(t1 - t0)
            direct.append(t2 - t1)
            per_call.append((t1 - t0) - (t2 - t1))
        loops = []
        n = args.loop
        for _ in range(max(1, args.iters // n)):
            t0 = clock()
            for _ in range(n):
                dispatch("ag_gemm", a, b, gather_dim=gd, out=out)
            t1 = clock()
            for _ in range(n):
                noop(ws, inputs, rctx, out)
            t2 = clock()
            loops.append(((t1 - t0) - (t2 - t1)) // n)
    finally:
        plan.run = real_run
    return {
        "isolated_overhead": _summary(per_call),
        "isolated_dispatch": _summary(disp),
        "isolated_direct": _summary(direct),
        "isolated_loop": _summary(loops),
    }


def _measure(ctx: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run on every rank; returns rank 0's numbers (other ranks take part in the collectives)."""
    import torch

    import autotaxer
    from autotaxer._problem import ProblemKey, torch_dtype
    from autotaxer.ops import get_op

    world = ctx.world_size if ctx is not None else 1
    device = ctx.device if ctx is not None else torch.device(args.device)
    cfg = autotaxer.RuntimeConfig(env_tables=False, shipped_tables=args.shipped, persist_misses=False)
    rt = autotaxer.init(cfg)
    gd = args.gather_dim
    key = ProblemKey.make(
        "ag_gemm", "x", world, args.dtype, {"M": args.M, "N": args.N, "K": args.K}, {"gather_dim": gd}
    )
    rank = ctx.rank if ctx is not None else 0
    a, b = get_op("ag_gemm").make_inputs(key, rank, device, seed=1)
    a, b = a.to(torch_dtype(args.dtype)), b.to(torch_dtype(args.dtype))
    out = torch.empty((args.M, args.N), dtype=a.dtype, device=device)
    dispatch = autotaxer.dispatch
    plan = rt.plan("ag_gemm", a, b, gather_dim=gd)
    variant_run, ws, rctx = plan.run, plan.workspace, plan.ctx
    inner = [0]
    clock = time.perf_counter_ns

    def probe(w, inputs, c, o):
        t0 = clock()
        r = variant_run(w, inputs, c, o)
        inner[0] = clock() - t0
        return r

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results: dict[str, list[int]] = {"insitu_overhead": [], "probe": [], "paired": [], "alloc": []}
    for mode_out in (out, None):
        for _ in range(args.warmup):
            dispatch("ag_gemm", a, b, gather_dim=gd, out=mode_out)
            variant_run(ws, (a, b), rctx, mode_out)
    sync()
    gc.collect()
    inputs = (a, b)
    for i in range(args.iters):
        if i % 256 == 0:
            sync()
        # dispatch through the probe: overhead = outer - inner
        plan.run = probe
        t0 = clock()
        dispatch("ag_gemm", a, b, gather_dim=gd, out=out)
        t1 = clock()
        results["insitu_overhead"].append(t1 - t0 - inner[0])
        # the probe alone around a direct call: its own cost
        t0 = clock()
        probe(ws, inputs, rctx, out)
        t1 = clock()
        results["probe"].append(t1 - t0 - inner[0])
        plan.run = variant_run
        # paired whole calls: dispatch then direct
        t0 = clock()
        dispatch("ag_gemm", a, b, gather_dim=gd, out=out)
        t1 = clock()
        variant_run(ws, inputs, rctx, out)
        t2 = clock()
        results["paired"].append((t1 - t0) - (t2 - t1))
        # the variant allocating the output (out=None) vs writing into out
        t0 = clock()
        variant_run(ws, inputs, rctx, None)
        t1 = clock()
        variant_run(ws, inputs, rctx, out)
        t2 = clock()
        results["alloc"].append((t1 - t0) - (t2 - t1))
    sync()
    direct = []
    for i in range(min(args.iters, 2000)):
        if i % 256 == 0:
            sync()
        t0 = clock()
        variant_run(ws, inputs, rctx, out)
        direct.append(clock() - t0)
    sync()
    isolated = _isolated(dispatch, plan, a, b, out, args)
    sync()
    return {
        "decision": {"variant": plan.decision.variant, "source": plan.decision.source},
        "variant_run": _summary(direct),
        **{name: _summary(vals) for name, vals in results.items()},
        **isolated,
    }


def _compiled(ctx: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--mode compiled`` on every rank: µs per call of each served form and of the plain PyTorch it
    replaces (rank 0's numbers; every rank calls the same functions in the same order)."""
    import torch
    import torch.distributed as dist

    import autotaxer
    import autotaxer.integrations.compiled  # noqa: F401  (registers the custom ops)
    from autotaxer._problem import ProblemKey
    from autotaxer.integrations.ag_gemm import _plain as ag_plain
    from autotaxer.integrations.gemm_rs import _plain as rs_plain
    from autotaxer.ops import get_op

    cfg = autotaxer.RuntimeConfig(env_tables=False, shipped_tables=args.shipped, persist_misses=False)
    rt = autotaxer.init(cfg)
    ws, shape = ctx.world_size, {"M": args.M, "N": args.N, "K": args.K}
    keys = {
        op: ProblemKey.make(op, "x", ws, args.dtype, shape, {field: 0, "b_layout": "nk"})
        for op, field in (("ag_gemm", "gather_dim"), ("gemm_rs", "scatter_dim"))
    }
    ag_a, ag_b = get_op("ag_gemm").make_inputs(keys["ag_gemm"], ctx.rank, ctx.device, seed=1)
    rs_a, rs_b = get_op("gemm_rs").make_inputs(keys["gemm_rs"], ctx.rank, ctx.device, seed=1)
    ops = torch.ops.autotaxer

    def compiled(fn: Any) -> Any:
        return torch.compile(fn, fullgraph=True)

    fns = {
        "ag_gemm custom op, compiled": compiled(lambda a, b: ops.ag_gemm(a, b, 0, "")),
        "all_gather + matmul, compiled": compiled(lambda a, b: ag_plain(a, b, 0, "")[0]),
        "ag_gemm custom op, eager": lambda a, b: ops.ag_gemm.default(a, b, 0, ""),
        "ag_gemm Runtime.dispatch": lambda a, b: rt.dispatch("ag_gemm", a, b, gather_dim=0),
        "gemm_rs custom op, compiled": compiled(lambda a, b: ops.gemm_rs(a, b, 0, "")),
        "matmul + reduce_scatter, compiled": compiled(lambda a, b: rs_plain(a, b, 0, "")[0]),
        "gemm_rs custom op, eager": lambda a, b: ops.gemm_rs.default(a, b, 0, ""),
        "gemm_rs Runtime.dispatch": lambda a, b: rt.dispatch("gemm_rs", a, b, scatter_dim=0),
    }
    inputs = {
        name: (ag_a, ag_b) if name.startswith(("ag_gemm", "all_gather")) else (rs_a, rs_b) for name in fns
    }
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    clock = time.perf_counter_ns
    per_call: dict[str, list[int]] = {name: [] for name in fns}
    with torch.no_grad():
        for name, fn in fns.items():  # compiles, decides (collectively) and warms up every form
            for _ in range(max(args.warmup // 10, 3)):
                fn(*inputs[name])
        sync()
        gc.collect()
        names = list(fns)
        for r in range(max(1, args.iters // args.loop)):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: drift hits all alike
                fn, (a, b) = fns[name], inputs[name]
                if ws > 1:
                    dist.barrier()
                sync()
                t0 = clock()
                for _ in range(args.loop):
                    fn(a, b)
                sync()
                per_call[name].append((clock() - t0) // args.loop)
    decisions = {
        "ag_gemm": rt.plan("ag_gemm", ag_a, ag_b, gather_dim=0).decision.variant,
        "gemm_rs": rt.plan("gemm_rs", rs_a, rs_b, scatter_dim=0).decision.variant,
    }
    return {"decisions": decisions, **{name: _summary(v) for name, v in per_call.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--mode", choices=("dispatch", "compiled"), default="dispatch")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--N", type=int, default=64)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--dtype", default=None, help="default: fp32 on CPU, bf16 on CUDA")
    ap.add_argument("--gather-dim", type=int, choices=(0, 1), default=0)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--loop", type=int, default=200, help="calls per loop of the isolated_loop measure")
    ap.add_argument("--shipped", action="store_true", help="load the shipped tables (default: none, BSP)")
    ap.add_argument("--json", type=Path, default=None, help="output file (default in the working folder)")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.loop < 1 or args.warmup < 0:
        ap.error("--iters and --loop must be at least 1, --warmup at least 0")
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
    if args.mode == "dispatch" and args.world_size == 1 and args.device == "cpu":
        numbers = _measure(None, args)
    else:  # compiled code needs a process group for the functional collectives, even of one rank
        from autotaxer.testing import run_ranks

        fn = _measure if args.mode == "dispatch" else _compiled
        numbers = run_ranks(fn, args.world_size, args.device, args=(args,), timeout=600)[0]
    import torch

    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    report = {
        "bench": "dispatch_overhead" if args.mode == "dispatch" else "dispatch_overhead --mode compiled",
        "date": datetime.now(timezone.utc).isoformat(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "device": args.device,
        "device_name": device_name,
        "world_size": args.world_size,
        "host": _host(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "shape": {"M": args.M, "N": args.N, "K": args.K, "dtype": args.dtype, "gather_dim": args.gather_dim},
        "iters": args.iters,
        "results": numbers,
    }
    path = args.json
    if path is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d")
        mode = "" if args.mode == "dispatch" else f"_{args.mode}"
        path = Path(f"dispatch_overhead{mode}_{args.device}_ws{args.world_size}_{stamp}.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    host = report["host"]
    if args.mode == "compiled":
        _print_compiled(numbers, args, device_name, host)
        print(f"written to {path}")
        return 0
    print(f"dispatch overhead ({args.device}, world size {args.world_size}, {device_name}); µs")
    print(f"host: {host.get('cpu_model')}, {host.get('logical_cpus', host['os_cpu_count'])} logical CPUs")
    print(f"{'measure':<20}{'p50':>9}{'p90':>9}{'p99':>9}{'mean':>9}")
    names = ("insitu_overhead", "probe", "isolated_overhead", "isolated_loop", "isolated_dispatch")
    for name in (*names, "isolated_direct", "paired", "alloc", "variant_run"):
        r = numbers[name]
        print(f"{name:<20}{r['p50_us']:>9.2f}{r['p90_us']:>9.2f}{r['p99_us']:>9.2f}{r['mean_us']:>9.2f}")
    print(f"written to {path}")
    return 0


def _print_compiled(numbers: dict[str, Any], args: argparse.Namespace, device_name: str, host: dict) -> None:
    where = f"{args.device}, world size {args.world_size}, {device_name}"
    shape = f"M={args.M} N={args.N} K={args.K} {args.dtype}"
    print(f"served calls from compiled code ({where}); µs a call, {shape}; served: {numbers['decisions']}")
    print(f"host: {host.get('cpu_model')}, {host.get('logical_cpus', host['os_cpu_count'])} logical CPUs")
    print(f"{'form':<36}{'p50':>9}{'p90':>9}{'mean':>9}")
    for name, r in numbers.items():
        if name != "decisions":
            print(f"{name:<36}{r['p50_us']:>9.2f}{r['p90_us']:>9.2f}{r['mean_us']:>9.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
