"""Does the first measurement of a process read slower than the same measurement later?

Each run is a fresh group of ranks (the tuner's worker path: ``execute_trial`` on a ``WorkerState``) that
times BSP at M=64 first, then at two larger M, then at M=64 three more times, with the timing defaults of
the device (``eager``, and on CUDA also ``graph``: the first graph capture of the process). Each mode runs
twice: as before the fix (the process warm-up of ``autotaxer.measure.warm_up`` skipped: the context is
marked warmed up) and as now. The ratio ``first / median(last three)`` should be near 1 with the warm-up.

    python3 -P bench/first_measurement.py --device cuda --world-size 2    # ~2 min on 2 GPUs
    python bench/first_measurement.py --device cpu                         # the CPU pipeline (gloo)

Prints one line per run and writes JSON to ``--out`` (default ``$OUT/first_measurement.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

#: (M, N, K) on GPUs (bf16) and on CPU (fp32): M=64 first and last, larger M between.
SHAPES = {"cuda": [(64, 8192, 8192), (1024, 8192, 8192), (4096, 8192, 8192)], "cpu": [(64, 256, 256),
          (512, 256, 512), (256, 512, 256)]}  # fmt: skip


def _rank(ctx: Any, device: str, mode: str, skip_warm_up: bool) -> list[float]:
    from autotaxer._problem import ProblemKey
    from autotaxer.measure import TimingConfig
    from autotaxer.tuner.worker import TrialRequest, WorkerState, execute_trial

    if skip_warm_up:
        ctx.warmed_up = True  # what every process did before the warm-up existed
    dtype = "bf16" if device == "cuda" else "fp32"
    first, *others = SHAPES[device]
    state = WorkerState(ctx)
    times = []
    for m, n, k in [first, *others, first, first, first]:
        key = ProblemKey.make("ag_gemm", ctx.target.gpu_model, ctx.world_size, dtype,
                              {"M": m, "N": n, "K": k}, {"gather_dim": 0})  # fmt: skip
        req = TrialRequest("ag_gemm", key, "bsp", {}, 0, TimingConfig.for_device(device, mode))
        reply = execute_trial(state, req)
        if reply.error is not None:
            raise RuntimeError(reply.error)
        times.append(reply.median_us)
    return times


def main() -> None:
    from autotaxer.testing import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "first_measurement.json"))
    args = parser.parse_args()
    modes = ("eager", "graph") if args.device == "cuda" else ("eager",)
    runs = []
    for mode in modes:
        for skip in (True, False):
            rank_args = (args.device, mode, skip)
            times = run_ranks(_rank, args.world_size, args.device, args=rank_args, timeout=600)[0]
            ratio = times[0] / statistics.median(times[-3:])
            label = "no process warm-up" if skip else "process warm-up"
            runs.append({"mode": mode, "warm_up": not skip, "shapes": SHAPES[args.device], "times_us": times,
                         "first_over_later": ratio})  # fmt: skip
            shown = " ".join(f"{t:.1f}" for t in times)
            print(f"{mode:5} {label:18}: µs {shown}  first/later {ratio:.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": args.device, "world_size": args.world_size, "runs": runs}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
