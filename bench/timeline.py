"""The device timeline of a fused-op call, per variant: what ran on which stream, and what overlapped.

    torchrun --nproc-per-node 4 bench/timeline.py --op ag_gemm --M 4096 --N 2560 --K 8192 \
        --entries bsp,torch_fused,copy_engine,ce_fanout [--params '{"copy_engine": {"chunks": 2}}'] \
        [--calls 5] [--replay] [--json-out timeline.json]

Issue 47: at four GPUs the copy-engine variants take about the sum of the all-gather and the GEMM (4xH100,
2026-11-28, M=4096 N=2560 K=8192: ``copy_engine`` 415 µs where the GEMM alone takes 220, NCCL's all-gather
192 and torch's fused op 302; ``bench/results/2026-11-28_tp4_layer_h100x4``). Per entry (a variant, its
default parameters unless ``--params`` names others) this traces ``--calls`` calls with
:mod:`torch.profiler` (CUDA activity), each waiting for the previous call's output as the tuner's timing
does, after ``--warmup`` untraced ones, and sums up per rank (:func:`summarize`): a call's span, each
stream's busy time, the GEMM kernels' union, the copies' union and how much of it ran under a GEMM, the
wait kernels' and the collectives' time, the copies' bytes and bandwidth. The slowest rank's summary is
printed; every rank's, with the last call's events (name, stream, start, duration), goes to
``--json-out``. ``--replay``: the calls go through the tuner's launcher (a CUDA-graph replay where the
variant is replayed) instead of ``variant.run``. On gloo (CPU) it runs as a smoke test (no device
activity: empty summaries).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Substrings of kernel names, lower-cased, that classify a device event (the first match wins).
KINDS = (
    ("collective", ("nccl",)),
    ("wait", ("wait", "spin", "barrier")),
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "matmul", "consume", "_kernel_mm")),
)


def kind_of(event: dict[str, Any]) -> str:
    """``copy`` (a copy-engine memcpy or memset), ``collective``, ``wait``, ``gemm`` or ``other``."""
    if event.get("cat") in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    name = str(event.get("name", "")).lower()
    for kind, needles in KINDS:
        if any(n in name for n in needles):
            return kind
    return "other"


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The total length of two unions' (sorted, disjoint) overlap."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def device_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The device activities of a Chrome trace from :mod:`torch.profiler`: kernels, memcpys, memsets."""
    cats = ("kernel", "gpu_memcpy", "gpu_memset")
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in cats]


def summarize(events: list[dict[str, Any]], calls: int) -> dict[str, Any]:
    """Per call (µs, the traced window divided by ``calls``): the span, each kind's union (``gemm``,
    ``copy``, ``wait``, ``collective``, ``other``), the copies' time under a GEMM, each stream's busy
    time, the copies' bytes and GB/s (their bytes over their union)."""
    if not events:
        return {"calls": calls, "span_us": None}
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events)
    by_kind: dict[str, list[tuple[float, float]]] = {}
    by_stream: dict[str, list[tuple[float, float]]] = {}
    copied = 0
    for e in events:
        start = float(e["ts"])
        span = (start, start + float(e.get("dur", 0)))
        kind = kind_of(e)
        by_kind.setdefault(kind, []).append(span)
        by_stream.setdefault(str(e.get("args", {}).get("stream", "?")), []).append(span)
        if kind == "copy":
            copied += int(e.get("args", {}).get("bytes", 0) or 0)
    unions = {k: union(v) for k, v in by_kind.items()}
    copy_us = length(unions.get("copy", []))
    out: dict[str, Any] = {
        "calls": calls,
        "span_us": (t1 - t0) / calls,
        **{f"{k}_us": length(u) / calls for k, u in sorted(unions.items())},
        "copy_under_gemm_us": intersect(unions.get("copy", []), unions.get("gemm", [])) / calls,
        "streams_busy_us": {s: length(union(v)) / calls for s, v in sorted(by_stream.items())},
        "copy_bytes": copied // calls,
        "copy_gbps": copied / copy_us / 1e3 if copy_us else None,
    }
    return out


def last_call(events: list[dict[str, Any]], calls: int) -> list[dict[str, Any]]:
    """The events of the traced window's last ``1 / calls`` share, times relative to its start."""
    if not events:
        return []
    t0 = min(float(e["ts"]) for e in events)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events)
    cut = t1 - (t1 - t0) / calls
    tail = sorted((e for e in events if float(e["ts"]) >= cut), key=lambda e: float(e["ts"]))
    return [
        {
            "name": str(e.get("name", ""))[:80],
            "kind": kind_of(e),
            "stream": e.get("args", {}).get("stream"),
            "start_us": round(float(e["ts"]) - cut, 2),
            "dur_us": round(float(e.get("dur", 0)), 2),
        }
        for e in tail
    ]


def _traced(fn: Any, calls: int, on_cuda: bool) -> list[dict[str, Any]]:
    """The device events of ``calls`` calls of ``fn`` under :mod:`torch.profiler`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if on_cuda:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return device_events(json.loads(path.read_text()))


def run(args: argparse.Namespace) -> int:
    """Trace every entry on every rank; rank 0 prints the slowest rank's summaries and writes the JSON."""
    import torch
    import torch.distributed as dist

    from autotaxer._problem import ProblemKey
    from autotaxer.measure import Chain
    from autotaxer.ops import get_op
    from autotaxer.runtime.replay import launcher
    from autotaxer.tools.bench_ranks import join_ranks

    rt, on_cuda = join_ranks(29534)
    ctx = rt.ctx
    dtype = "fp32" if not on_cuda and args.dtype == "bf16" else args.dtype
    layout = {"scatter_dim": 0} if args.op == "gemm_rs" else {"gather_dim": args.gather_dim}
    key = ProblemKey.make(
        args.op, ctx.target.gpu_model, dist.get_world_size(), dtype, {"M": args.M, "N": args.N, "K": args.K},
        {**layout, "b_layout": args.b_layout},
    )  # fmt: skip
    op = get_op(args.op)
    op.validate(key)
    inputs = op.make_inputs(key, ctx.rank, ctx.device, 1234)
    chosen = json.loads(args.params)
    results: dict[str, Any] = {}
    for name in [n for n in args.entries.split(",") if n]:
        variant = op.variants[name]
        params = chosen.get(name) or dict(variant.default_params(key, ctx.target))
        ws = variant.prepare(key, params, ctx)
        out = op.empty_output(key, ctx.device)
        call = launcher(op, variant, key, ctx.device) if args.replay else variant.run
        fn = Chain(inputs[0], out).wrap(lambda v=call, w=ws, o=out: v(w, inputs, ctx, out=o))
        for _ in range(args.warmup):
            fn()
        dist.barrier()
        events = _traced(fn, args.calls, on_cuda)
        mine = {
            "params": params,
            "summary": summarize(events, args.calls),
            "last_call": last_call(events, args.calls),
        }
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        results[name] = every
    if ctx.rank == 0:
        _print(key.text, results)
        if args.json_out:
            doc = {
                "key": key.text,
                "device": torch.cuda.get_device_name() if on_cuda else "cpu",
                "entries": results,
            }
            Path(args.json_out).write_text(json.dumps(doc, indent=1, default=str))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _print(key: str, results: dict[str, list[dict[str, Any]]]) -> None:
    """One line per entry: the slowest rank's summary (µs a call)."""
    cols = ("span_us", "gemm_us", "copy_us", "copy_under_gemm_us", "wait_us", "collective_us", "other_us")
    print(f"# {key}: µs a call, the slowest rank (span); copy GB/s; streams busy")
    print(f"{'entry':<14}" + "".join(f"{c[:-3]:>17}" for c in cols) + f"{'GB/s':>8}  streams")
    for name, ranks in results.items():
        worst = max(ranks, key=lambda r: r["summary"].get("span_us") or 0.0)["summary"]
        cells = "".join(f"{worst.get(c) or 0.0:>17.1f}" for c in cols)
        gbps = worst.get("copy_gbps")
        streams = " ".join(f"{s}:{us:.0f}" for s, us in worst.get("streams_busy_us", {}).items())
        print(f"{name:<14}{cells}{gbps or 0.0:>8.0f}  {streams}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="ag_gemm", choices=("ag_gemm", "gemm_rs"))
    ap.add_argument("--M", type=int, default=4096)
    ap.add_argument("--N", type=int, default=2560)
    ap.add_argument("--K", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--gather-dim", type=int, default=0, choices=(0, 1))
    ap.add_argument("--b-layout", default="nk", choices=("nk", "kn"))
    ap.add_argument("--entries", default="bsp,torch_fused,copy_engine", help="comma-separated variants")
    ap.add_argument("--params", default="{}", help="JSON object: variant -> its parameters (else defaults)")
    ap.add_argument("--calls", type=int, default=5, help="traced calls an entry (default 5)")
    ap.add_argument("--warmup", type=int, default=5, help="untraced calls first (default 5)")
    ap.add_argument("--replay", action="store_true", help="through the tuner's launcher (CUDA-graph replays)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error(f"--calls: must be >= 1, got {args.calls}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
