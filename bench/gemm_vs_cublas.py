"""The fused kernels' persistent GEMM alone against cuBLAS (``torch.matmul``) on one GPU.

For each shape and a few tile configs, median time of back-to-back calls (CUDA events around 50
calls, after warm-up); the best config per shape is compared with cuBLAS. Writes JSON to ``--out``.

    python bench/gemm_vs_cublas.py --out bench/results/gemm_vs_cublas.json
"""

from __future__ import annotations

import argparse
import json
import statistics

SHAPES = [(n, k) for n, k in ((8192, 8192), (28672, 8192), (8192, 28672))]
MS = (16, 64, 256, 1024, 4096, 16384)
CONFIGS = [  # (block_m, block_n, block_k, group_m, num_warps, num_stages, num_programs; 0 = one per SM)
    (128, 256, 64, 8, 8, 3, 0),
    (128, 256, 64, 8, 8, 4, 0),
    (128, 256, 64, 8, 8, 3, 1 << 30),
    (128, 128, 64, 8, 8, 4, 0),
    (128, 128, 64, 8, 4, 4, 0),
    (128, 128, 64, 8, 4, 4, 1 << 30),
    (64, 128, 64, 8, 4, 4, 0),
    (16, 64, 128, 8, 4, 4, 0),
    (16, 128, 128, 8, 4, 4, 0),
    (16, 64, 256, 8, 4, 3, 0),
]


def _time(fn, reps: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    args = parser.parse_args()
    import torch
    from autotaxer.kernels.gemm import GemmConfig, gemm

    rows = []
    for n, k in SHAPES:
        for m in map(int, args.ms.split(",")):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = a.float() @ b.float()
            t_cublas = _time(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
            best = None
            for bm, bn, bk, g, w, s, p in CONFIGS:
                if bm > max(16, 1 << (m - 1).bit_length()):
                    continue
                cfg = GemmConfig(
                    block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=w, num_stages=s, num_programs=p
                )
                try:
                    gemm(a, b, out, cfg)
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    t = _time(lambda cfg=cfg, a=a, b=b, out=out: gemm(a, b, out, cfg))
                except Exception as exc:  # a config that fails to compile is reported, not fatal
                    print(f"M={m} N={n} K={k} {cfg}: {type(exc).__name__}: {exc}"[:300])
                    continue
                if err > 1e-2:
                    print(f"M={m} N={n} K={k} {cfg}: WRONG rel err {err}")
                    continue
                if best is None or t < best[0]:
                    best = (t, cfg)
            row = {
                "M": m,
                "N": n,
                "K": k,
                "cublas_ms": t_cublas,
                "triton_ms": best[0] if best else None,
                "config": best[1].__dict__ if best else None,
                "ratio_cublas_over_triton": t_cublas / best[0] if best else None,
            }
            rows.append(row)
            tri = f"{best[0] * 1e3:8.1f} us  ratio {t_cublas / best[0]:.3f}" if best else "failed"
            print(
                f"M={m:6d} N={n:6d} K={k:6d} cublas {t_cublas * 1e3:8.1f} us  triton {tri}  {row['config']}"
            )
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
