"""Does a copy need SMs? Each copy issued beside a kernel that spins on the GPU for a while, holding every
thread slot (``all``), one block on each SM (``per_sm``: room left on every SM) or one block (``one``).

A copy that ends long before the spinner ran on a copy engine; one that ends just after it waited for SM
room: the driver made it a copy kernel. On one H200 (2026-11-29) a pinned host-to-device copy ran beside
the spinner and a same-device ``cuMemcpyAsync`` waited for it, also as ``cuMemcpyBatchAsync`` with the
``PREFER_OVERLAP_WITH_COMPUTE`` hint (``bench/results/2026-11-29_copy_needs_sms_h200``). That is what a
copy-engine variant's schedule must know: a transfer that needs SMs crawls, or waits, beside a persistent
GEMM whose tiles spin (``ce_persistent`` leaves one SM), and the one-GPU emulation of the peers, whose
copies are same-device ones, starves exactly there. With two GPUs visible the peer copies are probed too
(``p2p_push``: local source, the peer's memory as destination, issued on this GPU; ``p2p_pull``: the other
way), the spinner on the issuing GPU (``_dst`` rows: on the destination's).

    python3 -P bench/copy_sm_probe.py [--mib 64] [--spin-us 5000] [--json-out copy_sm.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import triton
import triton.language as tl
from autotaxer.kernels.common.watch import now_ns

#: Thread-slot occupancy of the spinner: blocks of 4 warps per SM (16 fill an SM's 2048 threads).
OCCUPANCY = {"all": 16, "per_sm": 1, "one": 0}


@triton.jit(do_not_specialize=["ns"])
def spin(out_ptr, ns):
    """Spin for ``ns`` nanoseconds of the GPU's clock, then store how many polls that took."""
    t0 = now_ns()
    n = 0
    while now_ns() - t0 < ns:
        n += 1
    tl.store(out_ptr + tl.program_id(0), n)


def _copy(kind: str, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
    """Issue one copy of ``kind`` on ``stream``: ``cuMemcpyAsync`` as the copy-engine variants issue it
    (:func:`autotaxer.kernels.common.signal.memcpy_async`), or ``d2d_batch``'s ``cuMemcpyBatchAsync``."""
    from autotaxer.kernels.common import signal as sig

    if kind != "d2d_batch":
        sig.memcpy_async(dst.data_ptr(), src.data_ptr(), nbytes, stream)
        return
    drv = sig._driver()
    attr = drv.CUmemcpyAttributes()
    attr.srcAccessOrder = drv.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    attr.flags = drv.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
    loc = drv.CUmemLocation()
    loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = dst.device.index
    attr.srcLocHint, attr.dstLocHint = loc, loc
    args = ([drv.CUdeviceptr(dst.data_ptr())], [drv.CUdeviceptr(src.data_ptr())], [nbytes], 1, [attr], [0], 1)
    try:
        result = drv.cuMemcpyBatchAsync(*args, sig._stream(stream))
    except TypeError:  # CUDA 12.8-12.9 bindings: a failure index before the stream
        result = drv.cuMemcpyBatchAsync(*args, 0, sig._stream(stream))
    sig._check(result, "cuMemcpyBatchAsync")


def _buffers(kind: str, nbytes: int) -> tuple[Any, Any, int, int]:
    """``(dst, src, issuing device, spinning device)`` of a case."""
    import torch

    dst_busy = kind.endswith("_dst")
    kind = kind.removesuffix("_dst")
    if kind == "h2d":
        return torch.zeros(nbytes, dtype=torch.uint8, device="cuda:0"), torch.randint(
            0, 255, (nbytes,), dtype=torch.uint8).pin_memory(), 0, 0  # fmt: skip
    src_dev, dst_dev = {"p2p_push": (0, 1), "p2p_pull": (1, 0)}.get(kind, (0, 0))
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=f"cuda:{src_dev}")
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{dst_dev}")
    if src_dev != dst_dev:
        dst.copy_(src)  # torch enables peer access between the two; the probe's copy is the raw one
        dst.zero_()
    return dst, src, 0, (dst_dev if dst_busy else 0)


def run_case(kind: str, occupancy: str, nbytes: int, spin_us: float) -> dict[str, Any]:
    """One copy beside one spinner: when each ended, from the spinner's start (ms), and the copy's data."""
    import torch

    dst, src, issue_dev, spin_dev = _buffers(kind, nbytes)
    base = kind.removesuffix("_dst")  # the copy itself; ``_dst``: the spinner on the destination's GPU
    with torch.cuda.device(spin_dev):
        sms = torch.cuda.get_device_properties(spin_dev).multi_processor_count
        out = torch.zeros(sms * 16, dtype=torch.int64, device=f"cuda:{spin_dev}")
        spin[(1,)](out, 1000, num_warps=4)  # compiled and loaded before the timed launch
        spin_stream = torch.cuda.Stream(spin_dev)
        start, spun = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(issue_dev):
        copy_stream = torch.cuda.Stream(issue_dev)
        issued, copied = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _copy(base, dst, src, nbytes, copy_stream)  # once untimed (first-call costs)
    devices = {issue_dev, spin_dev, dst.device.index}
    for d in devices:
        torch.cuda.synchronize(d)
    dst.zero_()  # before the spinner: a fill is a kernel, which would queue the copy behind it
    for d in devices:
        torch.cuda.synchronize(d)
    grid = max(1, sms * OCCUPANCY[occupancy])
    with torch.cuda.device(spin_dev), torch.cuda.stream(spin_stream):
        start.record()
        spin[(grid,)](out, int(spin_us * 1000), num_warps=4)
        spun.record()
    with torch.cuda.device(issue_dev), torch.cuda.stream(copy_stream):
        issued.record()
        _copy(base, dst, src, nbytes, copy_stream)
        copied.record()
    for d in devices:
        torch.cuda.synchronize(d)
    same = spin_dev == issue_dev
    row = {
        "copy": kind, "occupancy": occupancy, "grid": grid, "mib": nbytes >> 20,
        "spin_ms": start.elapsed_time(spun), "copy_ms": issued.elapsed_time(copied),
        "equal": bool(torch.equal(dst.cpu(), src.cpu())),
    }  # fmt: skip
    if same:
        row["copy_end_ms"] = start.elapsed_time(copied)
        row["beside"] = row["copy_end_ms"] < 0.5 * row["spin_ms"]
    else:  # events of two devices cannot be compared: the copy's own span says it
        row["beside"] = row["copy_ms"] < 0.5 * row["spin_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--spin-us", type=float, default=5000.0)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    import torch

    kinds = ["h2d", "d2d", "d2d_batch"]
    if torch.cuda.device_count() >= 2:
        kinds += ["p2p_push", "p2p_pull", "p2p_push_dst", "p2p_pull_dst"]
    rows = []
    for kind in kinds:
        for occupancy in OCCUPANCY:
            try:
                row = run_case(kind, occupancy, args.mib << 20, args.spin_us)
            except Exception as exc:  # noqa: BLE001 - the row names it, the probe goes on
                row = {
                    "copy": kind,
                    "occupancy": occupancy,
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                }
            rows.append(row)
            if "error" in row:
                print(f"{kind:13s} {occupancy:7s} ERROR {row['error']}", flush=True)
                continue
            end = f"ends {row['copy_end_ms']:8.3f} ms" if "copy_end_ms" in row else "(another GPU)"
            print(f"{kind:13s} {occupancy:7s} grid {row['grid']:5d}: spinner {row['spin_ms']:8.3f} ms, copy "
                  f"{row['copy_ms']:8.3f} ms, {end} -> {'beside' if row['beside'] else 'WAITED'}"
                  f"{'' if row['equal'] else ' WRONG DATA'}", flush=True)  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as f:
            found = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "rows": rows}
            json.dump(found, f, indent=1)
    return 0 if all(r.get("equal") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
