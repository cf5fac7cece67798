"""How dispatch's nearest-M reuse fared in side-by-side runs: every row whose ``dispatch`` entry came from a
neighbouring M's record, with the served variant and its speedup over BSP in each timing mode.

    python bench/nearest_reuse.py bench/results/*/bench_all*.json [--out F.md]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from autotaxer import ProblemKey


def reuse_rows(path: Path) -> list[dict]:
    """The nearest-served rows of one benchmark JSON (graph/eager speedups over the same mode's BSP)."""
    report = json.loads(path.read_text())
    out = []
    for row in report["rows"]:
        d = row.get("dispatch") or {}
        if d.get("source") != "nearest":
            continue
        x = {
            mode: row["bsp"][mode] / d[mode]
            for mode in ("graph", "eager")
            if d.get(mode) and row.get("bsp", {}).get(mode)
        }
        out.append({
            "run": path.parent.name, "ranks": report["world_size"], "N": row["N"], "K": row["K"],
            "gd": row["gather_dim"], "M": row["M"], "variant": d["variant"],
            "from_M": ProblemKey.from_text(d["tuned_key"])["M"], **x,
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=None, help="write the markdown here too")
    a = p.parse_args(argv)
    rows = [r for f in a.files for r in reuse_rows(f)]
    lines = ["| run | ranks | N | K | gd | M | served | from M | graph x | eager x |", "|---" * 10 + "|"]
    per_variant: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        g, e = r.get("graph"), r.get("eager")
        lines.append(
            f"| {r['run']} | {r['ranks']} | {r['N']} | {r['K']} | {r['gd']} | {r['M']} | {r['variant']} | "
            f"{r['from_M']} | {'' if g is None else f'{g:.2f}'} | {'' if e is None else f'{e:.2f}'} |"
        )
        if g is not None:
            per_variant[r["variant"]].append(g)
    lines.append("")
    for v, xs in sorted(per_variant.items()):
        lost = sum(x < 1.0 for x in xs)
        lines.append(f"{v}: {len(xs)} reuses, graph {min(xs):.2f}-{max(xs):.2f}x, {lost} below BSP")
    text = "\n".join(lines)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
