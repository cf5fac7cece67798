"""A small config sweep of the Iris-fused ag_gemm variants against BSP on 2 GPUs.

Per (variant, M, gather_dim, config): correctness against the fp32 reference, then the median of
back-to-back calls (CUDA events around 20 calls, 5 repeats, max over ranks) and of a CUDA graph of 20
calls replayed. BSP is timed the same two ways. JSON to ``--out``.

    torchrun-free: python bench/sweep_iris.py --out bench/results/sweep_iris.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

SMALL = [  # FusedConfig fields in order (prefetch_k left at 0): block_m, block_n, block_k, group_m,
    # num_warps, num_stages, comm_sms, row_chunks, k_chunks
    (16, 64, 128, 8, 4, 4, 8, 1, 4),
    (16, 64, 64, 8, 4, 4, 4, 1, 8),
    (16, 128, 128, 8, 4, 4, 8, 1, 4),
]
LARGE = [
    (128, 256, 64, 8, 8, 3, 16, 4, 1),
    (128, 128, 64, 8, 4, 4, 16, 8, 1),
    (128, 128, 64, 8, 8, 4, 8, 4, 2),
    (64, 128, 128, 8, 4, 3, 16, 1, 2),
]


def _time(fn, graph: bool, reps: int = 20) -> float:
    import torch
    import torch.distributed as dist

    for _ in range(3):
        fn()
    g = None
    if graph:
        s = torch.cuda.Stream()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                fn()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if g is not None:
            g.replay()
        else:
            for _ in range(reps):
                fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _sweep(ctx, ms: list[int], n: int, k: int, variants: list[str]) -> list[dict]:
    import torch
    from autotaxer.kernels.ag_gemm.fused import FusedConfig

    from autotaxer._problem import ProblemKey
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    rows = []
    for gd in (0, 1):
        for m in ms:
            key = ProblemKey.make(
                "ag_gemm",
                ctx.target.gpu_model,
                ctx.world_size,
                "bf16",
                {"M": m, "N": n, "K": k},
                {"gather_dim": gd},
            )
            inputs = op.make_inputs(key, ctx.rank, ctx.device, 1)
            ref = op.reference(key, ctx.rank, ctx.device, 1)
            out = op.empty_output(key, ctx.device)
            for name in ["bsp", *variants]:
                variant = op.variants[name]
                configs = (
                    [{}]
                    if name == "bsp"
                    else [dataclasses.asdict(FusedConfig(*c)) for c in (SMALL if m <= 256 else LARGE)]
                )
                for params in configs:
                    row = {"variant": name, "M": m, "N": n, "K": k, "gather_dim": gd, "params": params}
                    reason = None if name == "bsp" else variant.check(key, ctx.target, params)
                    if reason:
                        row["skipped"] = reason
                        rows.append(row)
                        continue
                    try:
                        ws = variant.prepare(key, params, ctx)
                        out.fill_(float("nan"))
                        variant.run(ws, inputs, ctx, out=out)
                        torch.cuda.synchronize()
                        row["rel_err"] = relative_error(out, ref)
                        fn = lambda v=variant, w=ws: v.run(w, inputs, ctx, out=out)  # noqa: E731, B023
                        row["eager_ms"] = _time(fn, graph=False)
                        row["graph_ms"] = _time(fn, graph=True)
                    except Exception as exc:  # report and go on with the sweep
                        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                    rows.append(row)
                    if ctx.rank == 0:
                        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--ms", default="16,256,1024,4096")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--variants", default="pull,push")
    parser.add_argument("--timeout", type=float, default=560.0, help="seconds for the whole sweep")
    args = parser.parse_args()
    from autotaxer.testing import run_ranks

    ms = [int(x) for x in args.ms.split(",")]
    sweep_args = (ms, args.n, args.k, args.variants.split(","))
    rows = run_ranks(_sweep, 2, "cuda", args=sweep_args, timeout=args.timeout)[0]
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    best: dict = {}
    for r in rows:
        if "graph_ms" not in r or not r.get("rel_err", 1) < 1e-2:
            continue
        k = (r["gather_dim"], r["M"], r["variant"])
        t = min(r["eager_ms"], r["graph_ms"])
        if k not in best or t < best[k][0]:
            best[k] = (t, r)
    print("gd     M  variant  best_ms(eager/graph)   speedup vs min(bsp eager, bsp graph)")
    for (gd, m, v), (t, r) in sorted(best.items()):
        bsp = best.get((gd, m, "bsp"))
        sp = bsp[0] / t if bsp else float("nan")
        print(f"{gd:2d} {m:6d}  {v:7s}  {r['eager_ms']:.4f}/{r['graph_ms']:.4f}  {sp:.2f}x  {r['params']}")


if __name__ == "__main__":
    main()
