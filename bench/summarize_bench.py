"""Markdown summary of side-by-side ag_gemm results (``bench/ag_gemm_bench.py`` / ``autotaxer bench``).

Per shape, layout and M: BSP (eager / graph), the ceiling max(all-gather, GEMM) as a speedup over the
faster BSP, the best fused variant, dispatch and the peers as speedups over the faster BSP (each at its
own faster mode), the same for eager against eager, and whether the best fused variant is within 10%
of the ceiling.

    python bench/summarize_bench.py bench/results/2026-11-22_sweep_h200x2/*.json > summary.md
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from autotaxer.benchmark.rows import best_us, bsp_us, case_fields, ceiling_us

PEERS = ("torch_fused", "iris_stock")


def _dim(row: dict) -> int:
    """The row's gather or scatter dimension (its op's first integer layout field)."""
    return next(v for f, v in case_fields(row).items() if f not in ("M", "N", "K") and isinstance(v, int))


def _x(base: float | None, t: float | None) -> str:
    return "-" if base is None or t is None else f"{base / t:.2f}"


def _best_variant(row: dict[str, Any], mode: str | None = None) -> tuple[str | None, float | None]:
    best: tuple[str | None, float | None] = (None, None)
    for name, entry in (row.get("variants") or {}).items():
        t = best_us(entry) if mode is None else entry.get(mode)
        if isinstance(t, (int, float)) and math.isfinite(t) and t > 0 and (best[1] is None or t < best[1]):
            best = (name, t)
    return best


def summarize(rows: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """Markdown lines and totals (geometric means, ceiling hits) for ``rows``."""
    lines = [
        "| N | K | gd | M | BSP eager / graph µs | ceiling x | best fused (x) | within 10% of ceiling "
        "| dispatch x (runs) | torch x | iris x | eager: fused x / dispatch x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    logs: dict[str, list[float]] = {"fused": [], "dispatch": [], "fused_eager": [], "dispatch_eager": []}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['N']} | {r['K']} | {_dim(r)} | {r['M']} | error: {r['error'][:60]} |")
            continue
        be, bg = r["bsp"].get("eager"), r["bsp"].get("graph")
        base = bsp_us(r)
        ceil = ceiling_us(r)
        name, t = _best_variant(r)
        ename, te = _best_variant(r, "eager")
        disp = r.get("dispatch") or {}
        td = best_us(disp)
        within = "-" if t is None or ceil is None else ("yes" if t <= 1.1 * ceil else "no")
        peers = [_x(base, best_us(r.get(p))) if r.get(p) and best_us(r.get(p)) else "-" for p in PEERS]
        lines.append(
            f"| {r['N']} | {r['K']} | {_dim(r)} | {r['M']} | {be:.1f} / {bg:.1f} | {_x(base, ceil)} "
            f"| {name} ({_x(base, t)}) | {within} | {_x(base, td)} ({disp.get('variant', '-')}) "
            f"| {peers[0]} | {peers[1]} | {ename} {_x(be, te)} / {_x(be, disp.get('eager'))} |"
        )
        for key, value, ref in (
            ("fused", t, base),
            ("dispatch", td, base),
            ("fused_eager", te, be),
            ("dispatch_eager", disp.get("eager"), be),
        ):
            if value and ref:
                logs[key].append(math.log(ref / value))
    totals = {k: round(math.exp(sum(v) / len(v)), 3) if v else None for k, v in logs.items()}
    return lines, totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="bench JSON files")
    args = ap.parse_args(argv)
    rows = []
    for path in args.results:
        with open(path) as f:
            report = json.load(f)
        rows += report["rows"]
    rows.sort(key=lambda r: (r["N"], r["K"], _dim(r), r["M"]))
    lines, totals = summarize(rows)
    print("\n".join(lines))
    print(f"\ngeometric means over {len(rows)} rows (x over BSP): {json.dumps(totals)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
