"""The fused kernels' persistent GEMM alone against cuBLAS (``torch.matmul``) on one GPU.

For each shape and a few tile configs, median time of back-to-back calls (CUDA events around 50
calls, after warm-up); the best config per shape is compared with cuBLAS. ``--fused`` also times the
``push``/``pull`` kernel itself with the communication taken away: the same kernel launched for one
rank (every row local, so no flag is ever waited on), with no dedicated producers (``comm_sms=0``) and
with 16 (they find nothing to move and join the GEMM through the tile queue), at the same tiles as the
persistent GEMM, the four (cuBLAS, GEMM, fused twice) timed side by side in rotating rounds. ``--tma``
adds ``push_tma``'s kernel (TMA loads in the GEMM) at one rank the same two ways, in the same rounds,
and a 5-stage 128x128 config TMA's registers allow. Writes JSON to ``--out``.

``--resources`` times nothing: per shape and M, the registers and spills of the fused ag_gemm kernel
against the plain persistent GEMM as ptxas compiled them for this GPU (each kernel compiled with
``JITFunction.warmup`` for the arguments its launcher would pass, nothing launched, then loaded to read
``n_regs`` and ``n_spills``: spills in the K loop cost throughput), at the tiles the fused seeds use:
``kernels/common/gemm.py``, the ``push`` kernel at one rank (the ``--fused`` runs) and ``push``/``pull``
at two (both layouts, with and without producers). Needs a GPU, not a second one.

    python3 -P bench/gemm_vs_cublas.py --out gemm_vs_cublas.json [--fused [--tma]] [--b-layout nk]
    python3 -P bench/gemm_vs_cublas.py --resources --shapes 8192x8192 --ms 1024 --out kernel_resources.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from autotaxer.tools.one_rank import fused_one_rank, interleaved

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
TMA_CONFIGS = [(128, 128, 64, 8, 4, 5, 0)]  # also timed with --tma
#: The row keys' name of each one-rank kernel (``fused_comm0_ms``, ``ratio_cublas_over_tma``, ...).
_ROW_NAMES = {"push": "fused", "push_tma": "tma"}


#: (block_m, block_n, block_k, group_m, num_warps, num_stages) of the tiles the fused seeds use.
RESOURCE_TILES = (
    (128, 128, 64, 8, 4, 4),
    (128, 128, 64, 8, 8, 4),
    (128, 256, 64, 8, 8, 3),
    (128, 256, 64, 8, 8, 4),
)


def _loaded(fn: Any, args: tuple, kw: dict) -> dict:
    """Registers, spills and shared memory of ``fn`` compiled for ``args`` (nothing launched)."""
    kw = dict(kw)
    compiled = fn.warmup(*args, grid=(1,), **kw)
    compiled._init_handles()
    return {"n_regs": compiled.n_regs, "n_spills": compiled.n_spills, "shared": compiled.metadata.shared}


def resources(n: int, k: int, m: int) -> list[dict]:
    """Per tile config of the fused seeds, each kernel's registers and spills (printed as it goes)."""
    from autotaxer.kernels.common.gemm import GemmConfig

    from autotaxer.tools.sm90 import fused_launch, gemm_launch

    rows = []
    for bm, bn, bk, g, w, s in RESOURCE_TILES:
        tiles = dict(block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=w, num_stages=s)
        found = {"gemm": _loaded(*gemm_launch(m, n, k, GemmConfig(**tiles)))}
        params = {**tiles, "comm_sms": 0, "row_chunks": 4, "k_chunks": 1, "prefetch_k": 0}
        fn, args, kw = fused_launch("push", m, n, k, 0, params, world_size=1)
        found["fused_one_rank"] = _loaded(fn, args, kw)
        for kind in ("push", "pull"):
            for comm in (0, 16):
                for gd in (0, 1):
                    fn, args, kw = fused_launch(kind, m, n, k, gd, {**params, "comm_sms": comm})
                    found[f"{kind}_comm{comm}_gd{gd}"] = _loaded(fn, args, kw)
        rows.append({"M": m, "N": n, "K": k, "tiles": tiles, "kernels": found})
        line = "  ".join(f"{name} {r['n_regs']}/{r['n_spills']}" for name, r in found.items())
        print(f"M={m} N={n} K={k} {bm}x{bn}x{bk} w{w} s{s} (regs/spills): {line}", flush=True)
    return rows


def _time(fn) -> float:
    """Median ms per call of ``fn`` alone: warm-up, then 5 samples of 50 back-to-back calls."""
    return interleaved([fn], reps=50, rounds=5)[0]


def fused_side_by_side(a, b, out, ref, cfg, kinds: tuple[str, ...] = ("push",)) -> dict:
    """cuBLAS, the persistent GEMM at ``cfg`` and each fused kernel of ``kinds`` (``push``, ``push_tma``) at
    one rank (``comm_sms`` 0 and 16) at ``cfg``'s tiles, each checked, then timed side by side (ms per
    call)."""
    import torch
    from autotaxer.kernels.common.gemm import gemm

    label = f"M={a.shape[0]} N={b.shape[1]} K={a.shape[1]} {cfg}"
    runs = {(kind, c): fused_one_rank(a, b, out, cfg, c, kind) for kind in kinds for c in (0, 16)}
    for (kind, c), run in runs.items():
        out.fill_(float("nan"))
        run()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err <= 1e-2:
            raise SystemExit(f"{label}: {kind} comm_sms={c} WRONG, relative error {err}")
    fns = [lambda: torch.matmul(a, b, out=out), lambda: gemm(a, b, out, cfg), *runs.values()]
    t_cb, t_gemm, *t_fused = interleaved(fns)
    t = dict(zip(runs, t_fused, strict=True))
    row = {"config": dict(cfg.__dict__), "cublas_ms": t_cb, "gemm_ms": t_gemm}
    line = f"{label}: side by side cublas {t_cb * 1e3:.1f} us, gemm {t_gemm * 1e3:.1f}"
    for kind in kinds:
        name = _ROW_NAMES[kind]
        best = min(t[kind, 0], t[kind, 16])
        row[f"{name}_comm0_ms"], row[f"{name}_comm16_ms"] = t[kind, 0], t[kind, 16]
        row[f"ratio_cublas_over_{name}"] = t_cb / best
        line += (
            f"; {kind} comm_sms=0 {t[kind, 0] * 1e3:.1f}, 16 {t[kind, 16] * 1e3:.1f}, "
            f"cublas/{kind} {t_cb / best:.3f}, gemm/{kind} {t_gemm / best:.3f}"
        )
    print(line)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    parser.add_argument("--shapes", default=None, help="comma list of NxK (default: the three LLM shapes)")
    parser.add_argument("--fused", action="store_true", help="also the fused kernel at one rank")
    parser.add_argument("--tma", action="store_true", help="with --fused: push_tma's kernel too")
    parser.add_argument(
        "--resources", action="store_true", help="registers and spills of each kernel instead of times"
    )
    parser.add_argument(
        "--b-layout", choices=("kn", "nk"), default="kn", help="nk: b a transposed (N, K) weight (nn.Linear)"
    )
    parser.add_argument(
        "--configs", default=None, help="bm,bn,bk,group_m,warps,stages,programs;... (default: a fixed set)"
    )
    args = parser.parse_args()
    configs = CONFIGS + (TMA_CONFIGS if args.tma else [])
    if args.configs:
        configs = [tuple(map(int, c.split(","))) for c in args.configs.split(";")]
    kinds = ("push", "push_tma") if args.tma else ("push",)
    import torch
    from autotaxer.kernels.common.gemm import GemmConfig, gemm

    shapes = SHAPES if not args.shapes else [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    if args.resources:
        found = [r for n, k in shapes for m in map(int, args.ms.split(",")) for r in resources(n, k, m)]
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": found}, f, indent=1)
        return
    rows = []
    for n, k in shapes:
        for m in map(int, args.ms.split(",")):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if args.b_layout == "nk":
                b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).t()
            else:
                b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = a.float() @ b.float()
            t_cublas = _time(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
            best = None
            fused: list[dict] = []  # per fused-eligible config: cuBLAS, gemm and fused side by side
            for bm, bn, bk, g, w, s, p in configs:
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
                if args.fused and p == 0 and bm >= 64:  # the tiles the fused seeds use from M=128
                    fused.append(fused_side_by_side(a, b, out, ref, cfg, kinds))
            row = {
                "M": m,
                "N": n,
                "K": k,
                "b_layout": args.b_layout,
                "cublas_ms": t_cublas,
                "triton_ms": best[0] if best else None,
                "config": best[1].__dict__ if best else None,
                "ratio_cublas_over_triton": t_cublas / best[0] if best else None,
            }
            if fused:  # the best fused config, against cuBLAS timed beside it
                row["fused"] = fused
                for kind in kinds:
                    key = f"ratio_cublas_over_{_ROW_NAMES[kind]}"
                    row[key] = max(f[key] for f in fused)
            rows.append(row)
            tri = f"{best[0] * 1e3:8.1f} us  ratio {t_cublas / best[0]:.3f}" if best else "failed"
            ratios = [(kind, row[f"ratio_cublas_over_{_ROW_NAMES[kind]}"]) for kind in kinds] if fused else []
            fus = "".join(f"  {kind} ratio {r:.3f}" for kind, r in ratios)
            head = f"M={m:6d} N={n:6d} K={k:6d} cublas {t_cublas * 1e3:8.1f} us"
            print(f"{head}  triton {tri}{fus}  {row['config']}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
