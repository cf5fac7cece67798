"""Where the fused kernel's GEMM loses to the plain persistent GEMM: ablations at one rank, one GPU.

The ``push``/``pull`` kernel launched for one rank (``gemm_vs_cublas.fused_one_rank``: every row local,
no flag ever waited on) runs the same K loop as ``kernels/gemm.py`` (same TTGIR), yet its tiles take
longer. Each ablation below is a copy of ``kernels/_ag_fused_kernel.py`` with one structural piece taken
out by a text substitution (the copy is written beside the original in the installed package and
imported from there; nothing in the repository changes). cuBLAS, the persistent GEMM, the kernel as it
is and every ablation are checked against the fp32 reference, then timed side by side in rotating
rounds (``gemm_vs_cublas._interleaved``). ``comm_sms=0`` throughout (the ablations that drop the tile
queue would give dedicated producers' tiles to nobody).

    CUDA_VISIBLE_DEVICES=0 python bench/consumer_ablation.py --ms 256,1024,4096 --out ablation.json
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

#: The tile queue off: tile pid, pid + grid, ... (the ``consume_tiles`` call's DYNAMIC flag).
_STATIC = ("WHOLE_K, DYNAMIC=True,", "WHOLE_K, DYNAMIC=False,")
#: The producers' step skipped (``STEPS`` never has bit 8).
_NO_PRODUCE = ("    if STEPS & 3:\n        if dedicated", "    if STEPS & 8:\n        if dedicated")

#: name -> (what it removes, [(old text, new text), ...]); each old text must occur exactly once.
ABLATIONS = {
    "static_tiles": ("the tile queue (no atomic per tile, no broadcast barrier)", [_STATIC]),
    "static_no_producer_step": (
        "the tile queue and the producers' step (nothing to move at one rank, but its code is there)",
        [_STATIC, _NO_PRODUCE],
    ),
    "static_no_epoch": (
        "the tile queue, the producers' step and the end-of-call count (epoch_end's atomics)",
        [
            _STATIC,
            _NO_PRODUCE,
            ("        epoch_end(sync_ptr, epoch, num_producers + num_consumers)", "        pass"),
        ],
    ),
    "int32_rows": (
        "64-bit row offsets (rows and the inbox offset in int32; fine for these sizes only)",
        [
            ("tl.where(offs_m < M, offs_m, M - 1).to(tl.int64)", "tl.where(offs_m < M, offs_m, M - 1)"),
            (
                "inbox = (tl.cast(inbox_ptr, tl.int64) - tl.cast(a_ptr, tl.int64)) // ELEM",
                "inbox = ((tl.cast(inbox_ptr, tl.int64) - tl.cast(a_ptr, tl.int64)) // ELEM).to(tl.int32)",
            ),
        ],
    ),
}


def ablated_kernel(name: str):
    """The fused kernel with ablation ``name`` applied (a module written beside the original)."""
    import autotaxer.kernels._ag_fused_kernel as original

    source = Path(original.__file__).read_text()
    for old, new in ABLATIONS[name][1]:
        if source.count(old) != 1:
            raise SystemExit(f"ablation {name}: {old!r} occurs {source.count(old)} times in the kernel")
        source = source.replace(old, new)
    path = Path(original.__file__).with_name(f"_ag_fused_kernel_ablate_{name}.py")
    path.write_text(source)
    return importlib.import_module(f"autotaxer.kernels._ag_fused_kernel_ablate_{name}").fused_ag_gemm_kernel


def with_kernel(kernel, run):
    """``run`` with the launcher's kernel swapped for ``kernel`` for the duration of each call."""
    import autotaxer.kernels._ag_fused as fused

    def call():
        saved, fused.KERNEL = fused.KERNEL, kernel
        try:
            return run()
        finally:
            fused.KERNEL = saved

    return call


def side_by_side(m: int, n: int, k: int, cfg, kernels: dict) -> dict:
    """cuBLAS, the persistent GEMM, the fused kernel and each ablation at ``cfg``: checked, then timed
    side by side (ms per call)."""
    import torch
    from autotaxer.kernels.gemm import gemm
    from gemm_vs_cublas import _interleaved, fused_one_rank

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float()
    fns = {
        "cublas": lambda: torch.matmul(x, w, out=out),
        "gemm": lambda: gemm(x, w, out, cfg),
        "fused": fused_one_rank(x, w, out, cfg, 0),
    }
    # each ablation gets its own launch cache (its own fused_one_rank), compiled with its kernel
    fns.update({name: with_kernel(kern, fused_one_rank(x, w, out, cfg, 0)) for name, kern in kernels.items()})
    errs = {}
    for name, fn in fns.items():
        out.fill_(float("nan"))
        fn()
        errs[name] = ((out.float() - ref).norm() / ref.norm()).item()
        if not errs[name] <= 1e-2:
            raise SystemExit(f"M={m} {cfg} {name}: WRONG, relative error {errs[name]}")
    times = dict(zip(fns, _interleaved(list(fns.values())), strict=True))
    return {"M": m, "N": n, "K": k, "config": dict(cfg.__dict__), "ms": times, "err": errs}


def main() -> None:
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).parent))  # python -P leaves the script's folder out
    from autotaxer.kernels.gemm import GemmConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="256,1024,4096")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    kernels = {name: ablated_kernel(name) for name in ABLATIONS}
    rows = []
    for m in (int(x) for x in a.ms.split(",")):
        for cfg in (GemmConfig(128, 128, 64, 8, 4, 4), GemmConfig(128, 256, 64, 8, 8, 4)):
            row = side_by_side(m, a.n, a.k, cfg, kernels)
            rows.append(row)
            base = row["ms"]["fused"]
            parts = "  ".join(f"{name} {v * 1e3:.1f} ({base / v:.3f})" for name, v in row["ms"].items())
            print(f"M={m} {cfg.block_m}x{cfg.block_n} w{cfg.num_warps}: {parts}", flush=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "ablations": {name: what for name, (what, _) in ABLATIONS.items()},
        "rows": rows,
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
