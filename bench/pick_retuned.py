"""The freshly tuned records that should replace shipped ones after a kernel change.

A re-tune after a kernel edit runs a few trials per shape; the shipped table may hold records from deeper
searches. This keeps those that are still current and picks from ``NEW`` only the records whose key the
shipped table lacks, whose shipped record is stale (its kernel sources changed), or whose speedup over
BSP (measured in the same run as the record, so comparable across runs) beats the shipped one's by more
than ``--margin``. Writes them as a table file for ``bench/merge_table.sh SHIPPED OUT``.

    python bench/pick_retuned.py tuning_db/nvidia-h200_ws2.json ag_eager.json --out picked.json
"""

from __future__ import annotations

import argparse

from autotaxer.runtime.table import stale_reasons
from autotaxer.table_file import read_table, write_table


def _name(key) -> str:
    shape = ",".join(f"{k}={v}" for k, v in key.shape)
    layout = ",".join(f"{k}={v}" for k, v in key.layout)
    return f"ws{key.world_size} {key.dtype} {shape} {layout}"


def pick(shipped: list, new: list, margin: float) -> tuple[list, list[str]]:
    """The records of ``new`` to take over ``shipped``, and one reason line per record of ``new``."""
    old = {r.key: r for r in shipped}
    picked, lines = [], []
    for rec in new:
        before = old.get(rec.key)
        stale = stale_reasons(before, {}) if before is not None else ()
        if before is None:
            why = "new key"
        elif stale:
            why = "shipped record stale"
        elif rec.speedup > before.speedup * (1 + margin):
            why = f"faster: {rec.speedup:.3f}x vs {before.speedup:.3f}x over BSP"
        else:
            lines.append(
                f"keep  {_name(rec.key)}: shipped {before.variant} {before.speedup:.3f}x, new {rec.variant} "
                f"{rec.speedup:.3f}x"
            )
            continue
        picked.append(rec)
        was = f"{before.variant} {before.speedup:.3f}x" if before is not None else "-"
        lines.append(f"take  {_name(rec.key)}: {why}; was {was}, now {rec.variant} {rec.speedup:.3f}x")
    return picked, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shipped")
    p.add_argument("new")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--margin", type=float, default=0.02, help="speedup gain needed to replace a current record"
    )
    a = p.parse_args()
    picked, lines = pick(read_table(a.shipped), read_table(a.new), a.margin)
    print("\n".join(lines))
    write_table(picked, a.out)
    print(f"{len(picked)} of {len(lines)} records picked -> {a.out}")


if __name__ == "__main__":
    main()
