"""The chunking tax of the copy-engine schedules, on one GPU: one vendor GEMM of all ``M`` rows against
the same product cut into the row runs a schedule issues (issue 47).

At ``W`` ranks a copy-engine schedule multiplies the rows it has as they land: ``copy_engine`` one GEMM
per peer and chunk (``ag_gemm``; ``gemm_rs`` one per destination's rows), ``ce_fanout``'s ``range`` the
local shard and then each contiguous run of peers' rows (two runs on a middle rank, one on the first and
last); ``ce_local_rest`` the local shard and one GEMM over every peer's rows, through a scratch copied
into ``out`` on a middle rank (``local+rest_copied``). Each piece is a GEMM of its own, with its own
partial last wave; this measures what that costs
with no communication at all: cuBLAS through ``torch.mm``, timed side by side by
:func:`autotaxer.measure.time_interleaved` (graph mode: each form a CUDA graph of ``--reps`` calls, one
sample of every form a round in a shuffled order, the median of ``--rounds`` rounds), µs per call, and its
ratio to the whole GEMM.

    python bench/gemm_split.py --out gemm_split.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

#: (op, M, N, K) at the TP4 / TP8 layer's keys (Llama-3-70B class, sequence parallel): K of ``gemm_rs``
#: is the full K (each rank multiplies ``K / W`` of it).
KEYS: tuple[tuple[str, int, int, int], ...] = tuple(
    (op, m, n, k)
    for m in (1024, 2048, 4096, 8192, 16384)
    for op, n, k in (
        ("ag_gemm", 2560, 8192),
        ("ag_gemm", 14336, 8192),
        ("gemm_rs", 8192, 8192),
        ("gemm_rs", 8192, 28672),
    )  # fmt: skip
)
FORMS = ("per_peer", "per_peer_x4", "local+run", "local+2runs", "local+rest_copied")


def pieces(form: str, m: int, ws: int) -> list[tuple[int, int]] | None:
    """Row runs ``(first, rows)`` of ``form`` on a middle rank (``ws // 2``), in issue order; None where
    the form does not apply (chunks under 64 rows)."""
    shard, rank = m // ws, ws // 2
    local = (rank * shard, shard)
    if form == "per_peer":
        return [(p * shard, shard) for p in range(ws)]
    if form == "per_peer_x4":
        if shard < 4 * 64:
            return None
        return [(p * shard + c * shard // 4, shard // 4) for p in range(ws) for c in range(4)]
    if form == "local+run":  # the first rank: its peers' rows are one run
        return [(0, shard), (shard, m - shard)]
    if form == "local+2runs":
        return [local, ((rank + 1) * shard, m - (rank + 1) * shard), (0, rank * shard)]
    raise ValueError(f"form: unknown {form!r}")


def measure(op: str, m: int, n: int, k: int, ws: int, ctx: Any, reps: int, rounds: int) -> dict[str, Any]:
    """One key's row: the whole GEMM and every form, µs (:func:`autotaxer.measure.time_interleaved` on
    ``ctx``, this process's one GPU, graph mode: each form a CUDA graph of ``reps`` calls, one sample of
    each a round in a shuffled order)."""
    import torch
    from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import out_runs

    from autotaxer.measure import time_interleaved

    dev = torch.device("cuda")
    k_rank = k if op == "ag_gemm" else k // ws
    a = torch.randn(m, k_rank, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k_rank, device=dev, dtype=torch.bfloat16)  # nn.Linear's weight (nk)
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    wt = w.t()

    def run(runs: list[tuple[int, int]]) -> Callable[[], None]:
        def fn() -> None:
            for first, rows in runs:
                torch.mm(a[first : first + rows], wt, out=out[first : first + rows])

        return fn

    shard, rank = m // ws, ws // 2
    scratch = torch.empty(m - shard, n, device=dev, dtype=torch.bfloat16)

    def rest_copied() -> None:
        """``ce_local_rest`` on a middle rank: the local GEMM, one GEMM over the peers' rows (here the
        rows of ``a`` but the local ones stand in for the inbox's), its runs copied into ``out``."""
        torch.mm(a[rank * shard : (rank + 1) * shard], wt, out=out[rank * shard : (rank + 1) * shard])
        torch.mm(a[: m - shard], wt, out=scratch)
        at = 0
        for first, count in out_runs(rank, ws, shard):
            out[first : first + count].copy_(scratch[at : at + count])
            at += count

    fns: dict[str, Callable[[], None]] = {"whole": run([(0, m)])}
    for form in FORMS:
        if form == "local+rest_copied":
            if op == "ag_gemm":  # ag_gemm's schedule only
                fns[form] = rest_copied
            continue
        runs = pieces(form, m, ws)
        if runs is not None:
            fns[form] = run(runs)
    timed = time_interleaved(list(fns.values()), ctx, ("graph",), warmup=3, iters=reps, samples=rounds)
    us = {name: t["graph"] for name, t in zip(fns, timed, strict=True)}
    row: dict[str, Any] = {"op": op, "world_size": ws, "M": m, "N": n, "K": k, "whole_us": us["whole"]}
    row.update({f"{form}_us": us.get(form) for form in FORMS})
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="4,8")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=None, help="JSON file of the rows")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gemm_split: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotaxer._target import cuda_target
    from autotaxer.ops import RunContext

    ctx = RunContext(rank=0, world_size=1, device=torch.device("cuda"), target=cuda_target(0))
    rows = []
    for ws in (int(x) for x in args.world_sizes.split(",")):
        for op, m, n, k in KEYS:
            rows.append(measure(op, m, n, k, ws, ctx, args.reps, args.rounds))
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "reps": args.reps,
            "rounds": args.rounds}  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"{meta['device']}: µs of the whole GEMM, each form × the whole")
    print(f"{'op':8} {'W':>2} {'M':>6} {'N':>6} {'K':>6} {'whole':>8} " + " ".join(f"{f:>12}" for f in FORMS))
    for r in rows:
        ratios = [r[f"{f}_us"] / r["whole_us"] if r[f"{f}_us"] else float("nan") for f in FORMS]
        print(f"{r['op']:8} {r['world_size']:>2} {r['M']:>6} {r['N']:>6} {r['K']:>6} {r['whole_us']:8.1f} "
              + " ".join(f"{x:12.2f}" for x in ratios))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
