"""nn.Linear's weight layout against the contiguous one, at world size 1 on one GPU (the GEMM core).

Two comparisons, each timed side by side (``autotaxer.measure.time_interleaved``: shuffled rounds,
median, eager and CUDA graph):

* per Triton variant (``push``, ``push_tma``) and M: the best of its seed configurations on
  ``b_layout=nk`` (B = ``weight.t()``) against the best on ``kn`` (B row-major), N=K=8192, bf16,
  gather_dim=0; cuBLAS (``F.linear`` and ``a @ b``) beside them;
* the BSP fallback through ``dispatch`` (an empty table) on ``weight.t()`` against what a user writes in
  plain PyTorch: ``all_gather_into_tensor`` + ``F.linear``, S=2048, H=8192 (a one-rank NCCL group).

    python bench/layout_ws1.py --out layout_ws1.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial

N = K = 8192
MS = (512, 1024, 4096)
VARIANTS = ("push", "push_tma")


def _best(entries: dict[str, dict]) -> tuple[str, float]:
    """The fastest entry (faster of eager and graph) and its µs."""
    best = {n: min(v for k, v in e.items() if k in ("eager", "graph") and v) for n, e in entries.items()}
    name = min(best, key=best.get)
    return name, best[name]


def _layouts(ctx) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from autotaxer import ProblemKey
    from autotaxer.measure import time_interleaved
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    rows = []
    for m in MS:
        fns, names, errors = [], [], {}
        w = (torch.randn(N, K, device=ctx.device) / K**0.5).bfloat16()
        a = torch.randn(m, K, device=ctx.device).bfloat16()
        ref = a.float() @ w.float().t()
        fns += [partial(F.linear, a, w), partial(torch.matmul, a, w.t().contiguous())]
        names += ["cublas_linear_nk", "cublas_matmul_kn"]
        for vname in VARIANTS:
            variant = op.variants[vname]
            if variant.unavailable_reason(ctx.target):
                continue
            for layout in ("kn", "nk"):
                key = ProblemKey.make("ag_gemm", ctx.target.gpu_model, 1, "bf16", {"M": m, "N": N, "K": K},
                                      {"gather_dim": 0, "b_layout": layout})  # fmt: skip
                b = w.t() if layout == "nk" else w.t().contiguous()
                for i, params in enumerate(variant.seed_configs(key, ctx.target)):
                    if variant.check(key, ctx.target, params) is not None:
                        continue
                    ws = variant.prepare(key, params, ctx)
                    out = torch.empty(m, N, device=ctx.device, dtype=torch.bfloat16)
                    variant.run(ws, (a, b), ctx, out)
                    torch.cuda.synchronize()
                    errors[f"{vname}_{layout}_{i}"] = relative_error(out, ref)
                    fns.append(partial(variant.run, ws, (a, b), ctx, out))
                    names.append(f"{vname}_{layout}_{i}")
        times = time_interleaved(fns, ctx, modes=("eager", "graph"), warmup=5, iters=20, samples=15)
        entries = dict(zip(names, times, strict=True))
        row = {"M": m, "N": N, "K": K, "entries": entries, "errors": errors}
        for vname in VARIANTS:
            per = {
                lay: {n: e for n, e in entries.items() if n.startswith(f"{vname}_{lay}_")}
                for lay in ("kn", "nk")
            }
            if per["kn"] and per["nk"]:
                (kn_name, kn), (nk_name, nk) = _best(per["kn"]), _best(per["nk"])
                row[vname] = {"kn_us": kn, "nk_us": nk, "nk_over_kn": nk / kn, "kn_best": kn_name,
                              "nk_best": nk_name}  # fmt: skip
        rows.append(row)
    return rows


def _fallback(ctx) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import autotaxer
    import autotaxer.runtime.dispatch
    from autotaxer.measure import time_interleaved

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    s, h = 2048, 8192
    x = torch.randn(s, h, device=ctx.device).bfloat16()
    w = (torch.randn(h, h, device=ctx.device) / h**0.5).bfloat16()
    gathered = torch.empty(s, h, device=ctx.device, dtype=torch.bfloat16)

    def plain():
        dist.all_gather_into_tensor(gathered, x)
        return F.linear(gathered, w)

    def fallback():
        return autotaxer.dispatch("ag_gemm", x, w.t(), gather_dim=0)

    def fallback_kn():
        return autotaxer.dispatch("ag_gemm", x, wk, gather_dim=0)

    wk = w.t().contiguous()
    err = (fallback().float() - plain().float()).abs().max().item()
    rt = autotaxer.runtime.dispatch.get_runtime()
    decision = {k.text: d.variant for k, d in rt.decisions().items()}
    times = time_interleaved([plain, fallback, fallback_kn], ctx, modes=("eager", "graph"), samples=25)
    out = dict(zip(("plain_allgather_linear", "dispatch_bsp_nk", "dispatch_bsp_kn"), times, strict=True))
    best = {n: min(v for k, v in e.items() if k in ("eager", "graph") and v) for n, e in out.items()}
    return {
        "S": s, "H": h, "entries": out, "max_abs_diff": err, "decision": decision,
        "eager_ratio": out["dispatch_bsp_nk"]["eager"] / out["plain_allgather_linear"]["eager"],
        "graph_ratio": out["dispatch_bsp_nk"]["graph"] / out["plain_allgather_linear"]["graph"],
        "best_ratio": best["dispatch_bsp_nk"] / best["plain_allgather_linear"],
    }  # fmt: skip


def _run(ctx) -> dict:
    import torch

    return {"device": torch.cuda.get_device_name(), "layouts": _layouts(ctx), "fallback": _fallback(ctx)}


def main() -> None:
    from autotaxer.testing import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    (result,) = run_ranks(_run, 1, "cuda", timeout=550)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"device {result['device']}")
    for row in result["layouts"]:
        for v in VARIANTS:
            if v in row:
                r = row[v]
                print(f"M={row['M']:>5} {v:9} kn {r['kn_us']:8.1f} us  nk {r['nk_us']:8.1f} us", end="")
                print(f"  nk/kn {r['nk_over_kn']:.3f}")
    fb = result["fallback"]
    print("fallback (S=2048, H=8192): dispatch bsp on weight.t() / plain all_gather + F.linear:", end=" ")
    print(f"eager {fb['eager_ratio']:.3f} graph {fb['graph_ratio']:.3f} best {fb['best_ratio']:.3f}", end=" ")
    print(f"(max |diff| {fb['max_abs_diff']:.3g})")


if __name__ == "__main__":
    main()
