"""Rank 0's ``ce_persistent`` call with its peers emulated on the same GPU: what the tiles' waits cost.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python -P bench/rank0_view.py --world-size 4 \\
        --shapes 1024x2560x8192:nk,4096x2560x8192:nk --polls atomic,load,sleep --delay-us 0,100 \\
        [--configs 2] [--signals triton,memop] [--calls 20] [--json-out rank0.json]

Issue 47: at four GPUs ``ce_persistent`` took 4-5x BSP's time at the keys where its tiles wait longest
(``bench/results/2026-11-27_ce_persistent_h200x4``), after the bound read that stalled it first was fixed.
Here every rank of ``--world-size`` lives on this GPU (:func:`autotaxer.tools.emulated_ranks.emulate`) and a
call is enqueued behind a gate (a sleep kernel of ``--gate-us`` that every stream waits for, longer than the
host takes to enqueue the call) so that its parts start together as on real peers: every rank's copy-engine
lanes (each optionally ``--delay-us`` later: a sleep kernel before its copies stands in for NVLink's slower
transfer, so the tiles wait about as long as there) and rank 0's persistent GEMM, whose tiles wait for those
rows; then each other rank's GEMM after the one before (its rows all landed: the GEMM with nothing to wait
on). Per (shape, flag read ``--polls``: the variant's ``poll``, delay, seed configuration): rank 0's GEMM, the
others' (median), cuBLAS on the gathered A, each the median over ``--calls``, every rank's last output (fresh
inputs each call) against fp32. The copies are device-to-device on one HBM, not NVLink: this shows what
waiting costs the GEMM (the polls against the local tiles' loads and the peers' releases), not the transfer. A
row says when the host took longer to enqueue the call than the gate held (then rank 0's tiles waited for the
host): on an H200 host (2026-11-28) 4 ranks' call took 3.2-4.1 ms to enqueue, past the 3 ms gate of that run
(``bench/results/2026-11-28_rank0_view_h200``); hence 8 ms.

Caveat (2026-11-29, ``bench/results/2026-11-29_copy_needs_sms_h200``): on one GPU the lanes' copies are
same-device ``cuMemcpyAsync``, which the driver runs as a copy kernel on the SMs, not on the copy engine
(``bench/copy_sm_probe.py``). Gated, they compete with rank 0's spinning tiles for SMs: at M=1024 N=2560
(80 tiles) rank 0 took 534-814 µs, and where the grid holds all SMs but one (M=1024 N=14336, M=4096)
a case did not finish in 150-200 s. So the gated rows measure copies starved of SMs, not what waiting costs
a GEMM whose rows arrive by copy engine. The first, ungated run (2026-11-28) ran the copies before the GEMM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from functools import partial
from typing import Any

#: ``ce_persistent``'s ``poll`` values by name (its kernel module's ``POLLS``).
POLLS = ("atomic", "load", "sleep")


def parse_shapes(text: str) -> list[tuple[int, int, int, str]]:
    """``MxNxK[:nk]`` items, comma-separated -> ``(M, N, K, b_layout)``."""
    shapes = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        dims, _, layout = item.partition(":")
        m, n, k = (int(x) for x in dims.split("x"))
        shapes.append((m, n, k, layout or "kn"))
    return shapes


def _cycles_per_us() -> float:
    """The GPU's clock as ``torch.cuda._sleep`` counts it."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # load it
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1000.0)


def run_case(key: Any, params: dict[str, Any], *, calls: int, delay_cycles: int, gate_cycles: int,
             per_us: float) -> dict[str, Any]:  # fmt: skip
    """One configuration at ``key``: rank 0's GEMM and the others' (µs, medians), every rank's error on the
    last call (each call's inputs fresh), the host's time to enqueue a call against the gate's."""
    import time

    import torch
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    from autotaxer.ops import relative_error
    from autotaxer.tools.emulated_ranks import emulate

    t0 = time.monotonic()
    op, _variant, _ctxs, works, mains = emulate("ag_gemm", "ce_persistent", key, params)
    ws, device = key.world_size, torch.device("cuda")
    send = cp._send_lane
    setup_s = time.monotonic() - t0

    def delayed_send(*args: Any) -> None:
        torch.cuda._sleep(delay_cycles)
        send(*args)

    events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(ws)]
    rank0, others, enqueue = [], [], []
    cp._send_lane = delayed_send if delay_cycles else send
    try:
        for call in range(calls + 3):  # 3 untimed
            inputs = [op.make_inputs(key, r, device, call) for r in range(ws)]
            shards = [a.contiguous() for a, _ in inputs]
            outs = [op.empty_output(key, device) for _ in range(ws)]
            torch.cuda._sleep(gate_cycles)  # the gate: nothing below starts before the host enqueued it all
            t_call = time.monotonic()
            started = []
            for r in range(ws):
                buf = works[r].buffers
                mains[r].wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(mains[r]):
                    started.append(cp.begin_call(buf["channel"], buf["plan"], shards[r], buf["watch"].tensor))
            before = None
            for r in range(ws):
                buf, (main, lanes) = works[r].buffers, started[r]
                with torch.cuda.stream(mains[r]):
                    if before is not None:
                        mains[r].wait_event(before)
                    events[r][0].record()
                    cp.launch_gemm(
                        buf["channel"], buf["plan"], buf["inbox"], shards[r], inputs[r][1], outs[r],
                        buf["sync"], buf["watch"].tensor, buf["cache"], buf["token"],
                    )  # fmt: skip
                    events[r][1].record()
                    cp.end_call(buf["channel"], buf["plan"], main, lanes)
                before = events[r][1]
            enqueue.append((time.monotonic() - t_call) * 1e6)
            for r in range(ws):
                torch.cuda.current_stream().wait_stream(mains[r])
            torch.cuda.synchronize()
            if call >= 3:
                rank0.append(events[0][0].elapsed_time(events[0][1]) * 1000.0)
                others += [events[r][0].elapsed_time(events[r][1]) * 1000.0 for r in range(1, ws)]
    finally:
        cp._send_lane = send
    last = calls + 2
    errors = [relative_error(outs[r], op.reference(key, r, device, last)) for r in range(ws)]
    return {
        "rank0_us": round(statistics.median(rank0), 2),
        "others_us": round(statistics.median(others), 2),
        "max_error": max(errors),
        "ok": all(e == e and e < 1e-2 for e in errors),
        "enqueue_us_max": round(max(enqueue), 1),
        "gate_us": round(gate_cycles / per_us, 1),
        "setup_s": round(setup_s, 1),
        "loop_s": round(time.monotonic() - t0 - setup_s, 1),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per row: the case, rank 0's and the others' GEMM, cuBLAS, and both over cuBLAS."""
    print(f"{'M':>6} {'N':>6} {'B':>3} {'poll':>7} {'delay':>6} {'tiles':>9} {'sig':>6} {'rank0':>8} "
          f"{'others':>8} {'cuBLAS':>8} {'r0/cuB':>7} {'oth/cuB':>7} ok")  # fmt: skip
    for r in rows:
        p = r["params"]
        tiles = f"{p['block_m']}x{p['block_n']}{'t' if p['tma'] else ''}"
        case = f"{r['M']:>6} {r['N']:>6} {r['b_layout']:>3} {r['poll']:>7} {r['delay_us']:>6.0f} {tiles:>9}"
        if "error" in r:
            print(f"{case} {p['signal']:>6} ERROR {r['error'][:80]}")
            continue
        r0, oth, cub = r["rank0_us"], r["others_us"], r["cublas_us"]
        times = f"{r0:>8.1f} {oth:>8.1f} {cub:>8.1f} {r0 / cub:>7.2f} {oth / cub:>7.2f}"
        gated = r["enqueue_us_max"] < r["gate_us"]
        print(f"{case} {p['signal']:>6} {times} {r['ok']}{'' if gated else ' (enqueue outran the gate)'}")


def emulation_parser(description: str) -> argparse.ArgumentParser:
    """The options of a gated emulation of N ranks on one GPU (this script's, ``concurrent_ranks.py``'s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--shapes", default="1024x2560x8192:nk,4096x2560x8192:nk")
    parser.add_argument("--configs", type=int, default=2, help="seed configurations a shape tries")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--gate-us", type=float, default=8000.0, help="longer than the host takes to enqueue")
    parser.add_argument("--json-out")
    return parser


def has_32_queues(script: str, why: str) -> bool:
    """Whether this process runs with ``CUDA_DEVICE_MAX_CONNECTIONS=32`` (the GPU's hardware queues, for
    ranks emulated on one GPU whose kernels spin); if not, says so on stderr, naming ``script`` and
    ``why``."""
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "32":
        return True
    print(f"{script}: run with CUDA_DEVICE_MAX_CONNECTIONS=32 ({why})", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = emulation_parser(__doc__.splitlines()[0])
    parser.add_argument("--polls", default="atomic,load,sleep")
    parser.add_argument("--delay-us", default="0,100", help="each lane's sleep before its copies")
    parser.add_argument("--signals", default="triton,memop", help="the flags' back ends to try")
    args = parser.parse_args(argv)
    if not has_32_queues("rank0_view", "a wait must not block a queue that a later rank's copy needs"):
        return 2
    import torch
    from autotaxer.kernels.ag_gemm.experimental.ce_persistent import bound_reads

    from autotaxer import ProblemKey
    from autotaxer._target import cuda_target
    from autotaxer.ops import get_op
    from autotaxer.tools.one_rank import ms_per_call

    target = cuda_target(0)
    variant = get_op("ag_gemm").variants["ce_persistent"]
    reads = bound_reads()  # the tiles' bound reads ($AUTOTAXER_CE_PERSISTENT_BOUND_READS), named in each row
    per_us = _cycles_per_us()
    signals = args.signals.split(",")
    rows = []
    for m, n, k, layout in parse_shapes(args.shapes):
        key = ProblemKey.make(
            "ag_gemm", target.gpu_model, args.world_size, "bf16", {"M": m, "N": n, "K": k},
            {"gather_dim": 0, "b_layout": layout},
        )  # fmt: skip
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if layout == "nk" else (
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16))  # fmt: skip
        gemm = partial(torch.mm, a, b)
        cublas = statistics.median(ms_per_call(gemm, 1) for _ in range(args.calls)) * 1000.0
        seeds = [s for s in variant.seed_configs(key, target) if s["signal"] in signals and s["poll"] == 0]
        for poll in args.polls.split(","):
            for delay in (float(d) for d in args.delay_us.split(",")):
                for params in ({**s, "poll": POLLS.index(poll)} for s in seeds[: args.configs]):
                    row = {"M": m, "N": n, "K": k, "b_layout": layout, "world_size": args.world_size,
                           "poll": poll, "delay_us": delay, "params": params, "bound_reads": reads,
                           "cublas_us": round(cublas, 2)}  # fmt: skip
                    try:
                        row.update(
                            run_case(key, params, calls=args.calls, delay_cycles=int(delay * per_us),
                                     gate_cycles=int(args.gate_us * per_us), per_us=per_us)
                        )  # fmt: skip
                    except Exception as exc:  # noqa: BLE001 - the row names it, the sweep goes on
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    print_table(rows)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
