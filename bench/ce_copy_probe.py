"""How fast the copy engines move a shard between two GPUs, with one or several streams.

The mid-M gap of issue 7: ``copy_engine`` gathers a mid-M shard (1-8 MiB) in 26-40 us on 2xH200, longer
than the GEMM it could hide under. This probe times a peer copy GPU0 -> GPU1 of ``size`` bytes split
into ``streams`` equal parts, each part on its own stream (so possibly its own copy engine), from one
event on the caller's stream to the join of every part, the stream held by a spin kernel while the host
issues the copies; median of ``--reps`` timed runs after warm-up.
One process, no Iris, no NCCL: the copy engines alone.

    source bench/device_env.sh && python3 -P bench/ce_copy_probe.py --out ce_copy_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics

SIZES_MIB = (0.125, 0.5, 2, 4, 8, 32)
STREAMS = (1, 2, 4, 8)


def probe(size: int, n_streams: int, reps: int, raw: bool = False) -> float:
    """Median microseconds of one split peer copy of ``size`` bytes (GPU0 -> GPU1): torch's ``copy_``,
    or with ``raw`` one ``cuMemcpyAsync`` per part (what ``copy_engine`` issues)."""
    import torch
    from autotaxer.kernels.common.signal import memcpy_async

    src = torch.randn(size // 4, device="cuda:0")
    dst = torch.empty(size // 4, device="cuda:1")
    parts = list(zip(src.chunk(n_streams), dst.chunk(n_streams), strict=True))
    main = torch.cuda.current_stream(0)
    streams = [torch.cuda.Stream(device=0) for _ in range(n_streams)]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for rep in range(reps + 5):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        # hold the stream (~0.5 ms) while the host issues the copies: the events then time the copies,
        # not the host's issue cost (torch's cross-device copy_ costs tens of us of host time each)
        with torch.cuda.stream(main):
            torch.cuda._sleep(1_000_000)
        start.record(main)
        for s, (a, b) in zip(streams, parts, strict=True):
            s.wait_stream(main)
            if raw:
                memcpy_async(b.data_ptr(), a.data_ptr(), a.numel() * a.element_size(), s)
            else:
                with torch.cuda.stream(s):
                    b.copy_(a, non_blocking=True)
        for s in streams:
            main.wait_stream(s)
        end.record(main)
        end.synchronize()
        if rep >= 5:
            times.append(start.elapsed_time(end) * 1e3)
    ok = torch.equal(dst.cpu(), src.cpu())
    if not ok:
        raise RuntimeError(f"copy of {size} bytes on {n_streams} streams is wrong")
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import torch

    if torch.cuda.device_count() < 2 or not torch.cuda.can_device_access_peer(0, 1):
        raise SystemExit("needs 2 GPUs with peer access")
    rows = []
    probe(1 << 20, 1, 1)  # torch's first cross-device copy enables peer access for the raw copies
    for raw in (False, True):
        print(("cuMemcpyAsync per part" if raw else "torch copy_ per part") + ", GPU0 -> GPU1")
        print(f"{'MiB':>6} " + " ".join(f"{n:>2} str us (GB/s)" for n in STREAMS))
        for mib in SIZES_MIB:
            size = int(mib * (1 << 20))
            cells = []
            for n in STREAMS:
                us = probe(size, n, a.reps, raw)
                rows.append({"mib": mib, "streams": n, "raw": raw, "us": us, "gb_s": size / us / 1e3})
                cells.append(f"{us:8.1f} ({size / us / 1e3:5.0f})")
            print(f"{mib:>6} " + " ".join(cells))
    if a.out:
        with open(a.out, "w") as f:
            report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
