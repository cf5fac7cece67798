"""Rank 0's ``ce_persistent`` call with its peers emulated on the same GPU: what the tiles' waits cost.

    CUDA_DEVICE_MAX_CONNECTIONS=32 python -P bench/rank0_view.py --world-size 4 \\
        --shapes 1024x2560x8192:nk,4096x2560x8192:nk --polls atomic,load,sleep --delay-us 0,100 \\
        [--configs 2] [--signals triton,memop] [--calls 20] [--source host] [--json-out rank0.json]

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
``--source host`` (:class:`HostSources`) makes the rows into rank 0 pinned-host-to-device copies, which run
on a copy engine, one peer's after another as on peers, and leaves the others out: rank 0's GEMM against
the overlap ceiling, max(the copies alone, the GEMM with nothing to wait on), at PCIe's bandwidth instead
of NVLink's; ``host_together`` lets every peer's rows arrive at once.
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


def parse_set(text: str) -> dict[str, int]:
    """``name=integer`` items, comma-separated -> a dict; ``ValueError`` naming the item that is not."""
    overrides = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise ValueError(f"--set: {item!r} is not name=integer")
        overrides[name] = int(value)
    return overrides


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


class HostSources:
    """``--source host`` / ``host_together``: the rows into rank 0 copied from pinned host memory (a copy
    engine, no SM), every other copy left out.

    On one GPU a same-device ``cuMemcpyAsync`` is a copy kernel on the SMs, which ``ce_persistent``'s grid
    leaves one of; a copy from pinned host memory runs on a copy engine, as a peer's NVLink copy is taken
    to. Each call's shards are staged in pinned buffers (:meth:`stage`); the copy function the lanes call
    (``signal.memcpy_async``) is swapped for :meth:`copy`, which reads a shard's staged copy and leaves
    out every copy whose destination is not rank 0's inbox: those would share PCIe (about 50 GB/s, a
    tenth of NVLink's) with rank 0's rows. ``host`` makes each left-out copy a wait of the time such a
    copy takes alone (:attr:`bytes_per_us`; ``copy_sm_probe.spin`` on the lane's stream, one program that
    the reserved SM runs; ``torch.cuda._sleep``, which counts SM cycles, ran 1.5-1.65x longer beside the
    GEMM on 2026-11-29), so that rank 0
    receives as on peers, one shard after another (rank ``r`` sends to ``r-1`` first: ``r+1``'s rows come
    first, then ``r+2``'s), each at the link's full speed. ``host_together`` leaves them out, so every
    peer's rows arrive at once, sharing the link. The flags are raised as before, so the other ranks' GEMMs
    run on stale inboxes: only rank 0's output is checked."""

    def __init__(self, shape: tuple[int, int], world_size: int, inbox: Any, *, in_order: bool) -> None:
        import torch

        self.host = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=True) for _ in range(world_size)]
        self.inbox = (inbox.data_ptr(), inbox.data_ptr() + inbox.numel() * inbox.element_size())
        self.device: list[int] = []
        self.landed: list[tuple[int, Any]] = []
        self.nbytes = self.host[0].numel() * self.host[0].element_size()
        self.in_order = in_order
        self.spun = torch.zeros(1, dtype=torch.int64, device="cuda")
        here = __file__.rsplit("/", 1)[0]
        if here not in sys.path:
            sys.path.insert(0, here)
        from copy_sm_probe import spin

        self.spin = spin
        self.bytes_per_us = self.nbytes / self._one_copy_us()

    def _one_copy_us(self) -> float:
        """One staged shard's copy to the device alone: median µs of 7."""
        import torch

        dst = torch.empty_like(self.host[0], device="cuda")
        times = []
        for _ in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(self.host[0], non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(times)

    def stage(self, shards: list[Any]) -> None:
        """Copy this call's shards into the pinned buffers (synchronously, before the gate)."""
        for host, shard in zip(self.host, shards, strict=True):
            host.copy_(shard)
        self.device = [s.data_ptr() for s in shards]
        self.landed = []

    def copy(self, real: Any, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """The lanes' copy: from the staged shard into rank 0's inbox; any other one left out (``host``:
        its time slept on ``stream``)."""
        import torch

        if not self.inbox[0] <= dst < self.inbox[1]:
            if self.in_order:  # on the GPU's ns timer: a clock-cycle sleep ran 1.5x long beside the GEMM
                self.spin[(1,)](self.spun, int(nbytes / self.bytes_per_us * 1000.0))
            return
        rank = -1
        for rank, (base, host) in enumerate(zip(self.device, self.host, strict=True)):  # noqa: B007
            if base <= src < base + self.nbytes:
                src = host.data_ptr() + (src - base)
                break
        real(dst, src, nbytes, stream)
        landed = torch.cuda.Event(enable_timing=True)
        landed.record(stream)
        self.landed.append((rank, landed))

    def arrivals_us(self, start: Any) -> list[list[float]]:
        """``[source rank, µs from start]`` for each chunk copied into rank 0 in the last call."""
        return [[rank, round(start.elapsed_time(e) * 1000.0, 1)] for rank, e in self.landed]

    def copies_alone_us(self, calls: int, gate_cycles: int) -> float:
        """The same bytes into rank 0 with no GEMM beside them (``host``: the peers' shards one after
        another on one stream; ``host_together``: one stream each, all at once), behind a gate; median µs
        over ``calls``."""
        import torch

        peers = self.host[1:]
        dst = [torch.empty_like(h, device="cuda") for h in peers]
        streams = (
            [torch.cuda.Stream()] * len(peers) if self.in_order else [torch.cuda.Stream() for _ in peers]
        )
        times = []
        for _ in range(calls + 3):
            start = torch.cuda.Event(enable_timing=True)
            ends = [torch.cuda.Event(enable_timing=True) for _ in peers]
            torch.cuda._sleep(gate_cycles // 4)
            start.record()
            for d, h, s, e in zip(dst, peers, streams, ends, strict=True):
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    d.copy_(h, non_blocking=True)
                    e.record()
            torch.cuda.synchronize()
            times.append(max(start.elapsed_time(e) for e in ends) * 1000.0)
        return statistics.median(times[3:])


def run_case(key: Any, params: dict[str, Any], *, calls: int, delay_cycles: int, gate_cycles: int,
             per_us: float, source: str = "device") -> dict[str, Any]:  # fmt: skip
    """One configuration at ``key``: rank 0's GEMM and the others' (µs, medians), every rank's error on the
    last call (each call's inputs fresh; rank 0's alone with ``source`` ``host``, :class:`HostSources`,
    which adds the copies' time alone), the host's time to enqueue a call against the gate's."""
    import time

    import torch
    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp
    from autotaxer.kernels.common import signal as sig

    from autotaxer.ops import relative_error
    from autotaxer.tools.emulated_ranks import emulate

    t0 = time.monotonic()
    op, _variant, _ctxs, works, mains = emulate("ag_gemm", "ce_persistent", key, params)
    ws, device = key.world_size, torch.device("cuda")
    send = cp._send_lane
    setup_s = time.monotonic() - t0
    real_copy = sig.memcpy_async
    hosted = None
    if source.startswith("host"):
        shape = (int(key["M"]) // ws, int(key["K"]))
        hosted = HostSources(shape, ws, works[0].buffers["inbox"], in_order=source == "host")
        sig.memcpy_async = partial(hosted.copy, real_copy)

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
            if hosted is not None:
                hosted.stage(shards)
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
            if call >= 3:  # the untimed calls load kernels (a compile outruns any gate)
                enqueue.append((time.monotonic() - t_call) * 1e6)
            for r in range(ws):
                torch.cuda.current_stream().wait_stream(mains[r])
            torch.cuda.synchronize()
            if call >= 3:
                rank0.append(events[0][0].elapsed_time(events[0][1]) * 1000.0)
                others += [events[r][0].elapsed_time(events[r][1]) * 1000.0 for r in range(1, ws)]
    finally:
        cp._send_lane = send
        sig.memcpy_async = real_copy
    last = calls + 2
    checked = range(1 if hosted is not None else ws)
    errors = [relative_error(outs[r], op.reference(key, r, device, last)) for r in checked]
    extra = {}
    if hosted is not None:  # when each chunk landed in the last call, from rank 0's GEMM's start
        arrivals = hosted.arrivals_us(events[0][0])
        extra = {
            "copies_us": round(hosted.copies_alone_us(calls, gate_cycles), 2),
            "arrivals_us": arrivals,
            "rank0_last_us": round(rank0[-1], 1),
        }
    return {
        **extra,
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
    """One line per row: the case, rank 0's and the others' GEMM, cuBLAS, and both over cuBLAS; with
    ``--source host`` also the copies alone and rank 0's GEMM over the overlap ceiling (the larger of the
    copies alone and the others' GEMM, which waits on nothing)."""
    print(f"{'M':>6} {'N':>6} {'B':>3} {'poll':>7} {'delay':>6} {'tiles':>9} {'sig':>6} {'rank0':>8} "
          f"{'others':>8} {'cuBLAS':>8} {'r0/cuB':>7} {'oth/cuB':>7} {'copies':>8} {'r0/ceil':>7} "
          "ok")  # fmt: skip
    for r in rows:
        p = r["params"]
        tiles = f"{p['block_m']}x{p['block_n']}{'t' if p['tma'] else ''}"
        case = f"{r['M']:>6} {r['N']:>6} {r['b_layout']:>3} {r['poll']:>7} {r['delay_us']:>6.0f} {tiles:>9}"
        if "error" in r:
            print(f"{case} {p['signal']:>6} ERROR {r['error'][:80]}")
            continue
        r0, oth, cub = r["rank0_us"], r["others_us"], r["cublas_us"]
        times = f"{r0:>8.1f} {oth:>8.1f} {cub:>8.1f} {r0 / cub:>7.2f} {oth / cub:>7.2f}"
        copies = r.get("copies_us")
        times += f" {copies:>8.1f} {r0 / max(copies, oth):>7.2f}" if copies else f" {'':>8} {'':>7}"
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
    parser.add_argument("--set", default="", help="k=v,... overriding the seeds' integer parameters")
    parser.add_argument(
        "--source",
        choices=("device", "host", "host_together"),
        default="device",
        help="host, host_together: the rows into rank 0 copied from pinned host memory (HostSources)",
    )
    args = parser.parse_args(argv)
    try:
        overrides = parse_set(args.set)
    except ValueError as exc:
        parser.error(str(exc))
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
        seeds = [{**s, **overrides} for s in seeds]
        for poll in args.polls.split(","):
            for delay in (float(d) for d in args.delay_us.split(",")):
                for params in ({**s, "poll": POLLS.index(poll)} for s in seeds[: args.configs]):
                    row = {"M": m, "N": n, "K": k, "b_layout": layout, "world_size": args.world_size,
                           "poll": poll, "delay_us": delay, "params": params, "bound_reads": reads,
                           "source": args.source,
                           "cublas_us": round(cublas, 2)}  # fmt: skip
                    try:
                        row.update(
                            run_case(key, params, calls=args.calls, delay_cycles=int(delay * per_us),
                                     gate_cycles=int(args.gate_us * per_us), per_us=per_us,
                                     source=args.source)
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
