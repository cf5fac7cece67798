"""``push_ws``'s warp-specialised consumer on one Hopper GPU: the GEMM alone, and two emulated ranks.

Per problem (bf16, gather_dim=0 unless stated), each entry checked against fp32 on random inputs first
(NaN-poisoned output), then timed side by side (median of rotating rounds; ``--timing graph``: each
entry captured ``reps`` times in a CUDA graph, so host launch costs drop out):

* one rank, communication taken away: cuBLAS on the gathered A, ``push_tma``'s kernel at one rank (the
  shipped TMA consumer) at its two seed tiles, and the warp-specialised kernel (``wait=False``) per
  config of ``WS_CONFIGS``;
* two ranks on this GPU (``autotaxer.ops.ag_gemm.experimental.emulated_pair``, the best config with
``comm_sms`` producers):
  rank 1's ``push`` producers then rank 0's consumer (``sequential``), both at once (``overlapped``),
  and the consumer alone on its grid (flags already raised): what hiding the transfer behind the GEMM
  saves when the copy is local HBM to HBM, per producer count and chunking (``TRANSFERS``).

    python bench/ws_one_gpu.py --out F.json [--ms 256,1024] [--shapes 8192x8192] [--timing graph|eager]
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from autotaxer.tools.one_rank import fused_one_rank, interleaved

WS_CONFIGS = [  # WsConfig fields: block_m, block_n, block_k, stages, group_m, mma_wgs
    (128, 256, 64, 3, 8, 2),
    (128, 256, 64, 4, 8, 2),
    (128, 128, 64, 5, 8, 2),
    (128, 128, 64, 4, 8, 1),
    (128, 128, 64, 6, 8, 1),
]


#: ``(comm_sms, row_chunks, k_chunks)`` of the two-rank rows (the consumer gets the other SMs).
TRANSFERS = ((4, 4, 8), (2, 2, 8), (4, 1, 16), (8, 4, 8))


def _graph_interleaved(fns, reps: int = 20, rounds: int = 7) -> list[float]:
    """Median ms per call of each of ``fns``: each captured ``reps`` times in a CUDA graph (GPU time, no
    host launch cost), the replays timed side by side by ``_interleaved``."""
    import torch

    graphs = []
    side = torch.cuda.Stream()
    for fn in fns:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        graphs.append(g)
    return [t / reps for t in interleaved([g.replay for g in graphs], reps=1, rounds=rounds)]


def _rel_err(out, ref) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def _ws_config(c):
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

    return WsConfig(block_m=c[0], block_n=c[1], block_k=c[2], stages=c[3], group_m=c[4], mma_wgs=c[5])


def _one_rank_ws(a, b, out, config):
    """The consumer at one rank (every row local): the GEMM alone over the same schedule."""
    import torch
    from autotaxer.kernels.ag_gemm.experimental.ws import ag_gemm_ws
    from autotaxer.kernels.common.gemm import num_sms

    m, k = a.shape
    inbox = torch.empty(2, 1, m, k, device=a.device, dtype=a.dtype)
    flags = torch.zeros(2, device=a.device, dtype=torch.int32)
    sync = torch.zeros(2, device=a.device, dtype=torch.int64)
    return functools.partial(
        ag_gemm_ws, a_shard=a, b=b, out=out, inbox=inbox, flags=flags, sync=sync, arrivals=1, rank=0,
        world_size=1, gather_dim=0, geometry=(m, 1, k, 1), config=config, grid=num_sms(a.device), wait=False,
    )  # fmt: skip


def _pair_row(m, n, k, gd, ws_cfg, comm_sms, row_chunks, k_chunks, timer) -> dict:
    """Two emulated ranks at ``ws_cfg``: producers then consumer, and both at once (checked first)."""
    import torch
    from autotaxer.kernels.ag_gemm.fused import FusedConfig
    from autotaxer.kernels.common.gemm import num_sms

    from autotaxer.ops.ag_gemm.experimental.emulated_pair import EmulatedPushPair

    bm, bn, bk, stages, group, wgs = ws_cfg
    config = FusedConfig(bm, bn, bk, group, 4 * wgs, stages, comm_sms, row_chunks, k_chunks, 0)
    pair = EmulatedPushPair(m, n, k, gd, torch.bfloat16, config, num_sms(torch.device("cuda")))
    for overlap in (True, False):
        pair.poison()
        pair.call(overlap=overlap)
        err = _rel_err(pair.out, pair.reference())
        if not err < 1e-2:
            raise SystemExit(f"pair M={m} N={n} K={k} gd={gd} {config}: WRONG, relative error {err}")
    # consumer alone: the flags of the last call stay raised and no arrival is counted, so nothing waits
    t_seq, t_ovl, t_cons = timer(
        [
            lambda: pair.call(overlap=False),
            lambda: pair.call(overlap=True),
            lambda: pair.calls[0].consumer(pair.shards[0], pair.b, pair.out),
        ]
    )
    return {"gather_dim": gd, "config": list(config.__dict__.values()), "sequential_us": t_seq * 1e3,
            "overlapped_us": t_ovl * 1e3, "consumer_alone_us": t_cons * 1e3}  # fmt: skip


def _time_problem(m: int, n: int, k: int, timer) -> dict:
    """The one-rank entries side by side, then the pair rows at the best warp-specialised config."""
    import torch
    from autotaxer.kernels.common.gemm import GemmConfig

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    fns = {"cublas": lambda: torch.matmul(a, b, out=out)}
    for cfg in ((128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 4, 4)):
        fns[f"push_tma {cfg}"] = fused_one_rank(a, b, out, GemmConfig(*cfg), 0, "push_tma")
    for c in WS_CONFIGS:
        fns[f"ws {c}"] = _one_rank_ws(a, b, out, _ws_config(c))
    ref = a.float() @ b.float()
    for name, fn in fns.items():
        out.fill_(float("nan"))
        fn()
        err = _rel_err(out, ref)
        if not err < 1e-2:
            raise SystemExit(f"M={m} N={n} K={k} {name}: WRONG, relative error {err}")
    t = dict(zip(fns, timer(list(fns.values())), strict=True))
    best_ws = min((v, i) for i, v in enumerate(t[f"ws {c}"] for c in WS_CONFIGS))
    best_tma = min(v for name, v in t.items() if name.startswith("push_tma"))
    row = {
        "M": m, "N": n, "K": k, "us": {name: v * 1e3 for name, v in t.items()},
        "cublas_over_ws": t["cublas"] / best_ws[0], "cublas_over_push_tma": t["cublas"] / best_tma,
        "best_ws": WS_CONFIGS[best_ws[1]],
    }  # fmt: skip
    if m >= 256:
        best = WS_CONFIGS[best_ws[1]]
        row["pairs"] = [_pair_row(m, n, k, gd, best, *t, timer) for gd in (0, 1) for t in TRANSFERS]
    return row


def timings(ms: list[int], shapes: list[tuple[int, int]], timer) -> list[dict]:
    rows = []
    for n, k in shapes:
        for m in ms:
            row = _time_problem(m, n, k, timer)
            rows.append(row)
            line = " ".join(f"{name} {v:.1f}" for name, v in row["us"].items())
            keys = ("sequential_us", "overlapped_us", "consumer_alone_us")
            pairs = [
                (p["gather_dim"], p["config"][6], *(round(p[x], 1) for x in keys))
                for p in row.get("pairs", [])
            ]
            print(
                f"M={m} N={n} K={k}: {line} | cublas/ws {row['cublas_over_ws']:.3f} "
                f"cublas/push_tma {row['cublas_over_push_tma']:.3f} | "
                f"pairs (gd, comm_sms, row_chunks, k_chunks, seq, overlap, consumer) {pairs}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ms", default="256,512,1024,4096")
    parser.add_argument("--shapes", default="8192x8192,28672x8192,8192x28672")
    parser.add_argument("--timing", choices=("graph", "eager"), default="graph")
    args = parser.parse_args()
    import torch
    import triton

    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    timer = _graph_interleaved if args.timing == "graph" else interleaved
    result["timing"] = args.timing
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    result["timings"] = timings([int(x) for x in args.ms.split(",")], shapes, timer)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
