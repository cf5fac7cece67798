"""The cost of the bounded peer waits (issue 35), old tree beside new, from ``bench/bound_cost.sh``'s files.

Reads ``cublas_{old,new}{0,1}.json`` (``gemm_vs_cublas.py --fused --tma``: the fused kernels at one rank
against cuBLAS timed beside them, each tree on both GPUs) and ``bench_{old,new}.json`` (``autotaxer bench
--world-size 2``); prints two short tables and writes them as JSON.

    python3 -P bench/bound_cost_table.py --dir $OUT --out $OUT/bound_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"{path.name}: {type(exc).__name__}: {exc}")
        return None


def gemm_core(folder: Path) -> list[dict[str, Any]]:
    """Per shape: cuBLAS over the fused kernel (push, push_tma) at one rank, each tree's mean over GPUs."""
    rows: dict[tuple, dict[str, Any]] = {}
    for tree in ("old", "new"):
        for gpu in (0, 1):
            data = _load(folder / f"cublas_{tree}{gpu}.json")
            for r in (data or {}).get("rows", []):
                row = rows.setdefault((r["M"], r["N"], r["K"]), {"M": r["M"], "N": r["N"], "K": r["K"]})
                for kind in ("fused", "tma"):
                    ratio = r.get(f"ratio_cublas_over_{kind}")
                    if ratio is not None:
                        row.setdefault(f"{kind}_{tree}", []).append(ratio)
    out = []
    for row in rows.values():
        for name in [k for k in row if isinstance(row[k], list)]:
            row[name] = statistics.mean(row[name])
        out.append(row)
    return out


def _best_us(entry: Any) -> float | None:
    if not isinstance(entry, dict):
        return None
    vals = [entry.get(m) for m in ("eager", "graph")]
    vals = [v for v in vals if isinstance(v, (int, float)) and v > 0]
    return min(vals) if vals else None


def per_op(folder: Path) -> list[dict[str, Any]]:
    """Per bench row and variant: the best time (us, faster of eager and graph) in each tree."""
    found: dict[tuple, dict[str, Any]] = {}
    for tree in ("old", "new"):
        data = _load(folder / f"bench_{tree}.json")
        for r in (data or {}).get("rows", []):
            layout = f"gd{r['gather_dim']}" if r.get("op") == "ag_gemm" else f"sd{r.get('scatter_dim', 0)}"
            case = f"{r.get('op')} M={r['M']} N={r['N']} K={r['K']} {layout}"
            entries = {"bsp": r.get("bsp"), **(r.get("variants") or {})}
            for name, entry in entries.items():
                row = found.setdefault((case, name), {"case": case, "variant": name})
                row[tree] = _best_us(entry)
    return list(found.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    core, ops = gemm_core(args.dir), per_op(args.dir)
    print("GEMM core at one rank: cuBLAS time / fused kernel time (higher is better), mean of both GPUs")
    print(f"{'M':>6} {'N':>6} {'K':>6} | {'push old':>9} {'push new':>9} | {'tma old':>8} {'tma new':>8}")
    for r in sorted(core, key=lambda r: (r["N"], r["K"], r["M"])):
        cells = [f"{r.get(k, float('nan')):9.3f}" for k in ("fused_old", "fused_new")]
        cells += [f"{r.get(k, float('nan')):8.3f}" for k in ("tma_old", "tma_new")]
        print(f"{r['M']:6d} {r['N']:6d} {r['K']:6d} | {cells[0]} {cells[1]} | {cells[2]} {cells[3]}")
    print("\n2-GPU per-op bench: best of eager and graph, us (new/old near 1.00 = within noise)")
    print(f"{'case':<40} {'variant':<12} {'old':>9} {'new':>9} {'new/old':>8}")
    for r in sorted(ops, key=lambda r: (r["case"], r["variant"])):
        old, new = r.get("old"), r.get("new")
        ratio = f"{new / old:8.3f}" if old and new else f"{'-':>8}"
        fmt = [f"{v:9.1f}" if v else f"{'-':>9}" for v in (old, new)]
        print(f"{r['case']:<40} {r['variant']:<12} {fmt[0]} {fmt[1]} {ratio}")
    args.out.write_text(json.dumps({"gemm_core": core, "per_op": ops}, indent=1))


if __name__ == "__main__":
    main()
