"""Registers and spills of the fused ag_gemm kernel against the plain persistent GEMM, as compiled here.

Each kernel is compiled for this machine's GPU with ``JITFunction.warmup`` (nothing is launched) for the
arguments its launcher would pass, then loaded to read ``n_regs`` and ``n_spills`` (what ptxas chose;
spills in the K loop cost throughput). Kernels: ``kernels/common/gemm.py``, the ``push``/``pull`` kernel at
one rank (the one-rank runs of ``gemm_vs_cublas.py --fused``) and at two (both layouts). Needs a GPU, not
a second one.

    python bench/kernel_resources.py --m 1024 --out kernel_resources.json
"""

from __future__ import annotations

import argparse
import json

#: (block_m, block_n, block_k, group_m, num_warps, num_stages) of the tiles the fused seeds use.
TILES = ((128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4))


def _loaded(fn, args, kw) -> dict:
    kw = dict(kw)
    compiled = fn.warmup(*args, grid=(1,), **kw)
    compiled._init_handles()
    return {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills, "shared": compiled.metadata.shared}


def main() -> None:
    import torch
    from autotaxer.kernels.common.gemm import GemmConfig

    from autotaxer.tools.sm90 import fused_launch, gemm_launch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=1024)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rows = []
    for bm, bn, bk, g, w, s in TILES:
        tiles = dict(block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=w, num_stages=s)
        found = {"gemm": _loaded(*gemm_launch(a.m, a.n, a.k, GemmConfig(**tiles)))}
        params = {**tiles, "comm_sms": 0, "row_chunks": 4, "k_chunks": 1, "prefetch_k": 0}
        fn, args, kw = fused_launch("push", a.m, a.n, a.k, 0, params, world_size=1)
        found["fused_one_rank"] = _loaded(fn, args, kw)
        for kind in ("push", "pull"):
            for comm in (0, 16):
                for gd in (0, 1):
                    fn, args, kw = fused_launch(kind, a.m, a.n, a.k, gd, {**params, "comm_sms": comm})
                    found[f"{kind}_comm{comm}_gd{gd}"] = _loaded(fn, args, kw)
        rows.append({"tiles": tiles, "kernels": found})
        line = "  ".join(f"{name} {r['n_regs']}/{r['n_spills']}" for name, r in found.items())
        print(f"{bm}x{bn}x{bk} w{w} s{s} (regs/spills): {line}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "M": a.m, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
