"""Several `autotaxer bench` runs of the same keys side by side: per key, each run's time of some entries.

    python bench/ab_table.py [--entries dispatch,push,pull] [--mode graph] NAME=RUN.json.rows.jsonl ...

An A/B of a setting (e.g. ``$AUTOTAXER_WAIT_CHECK_AFTER_US``, ``bench/device.sh bound-ab``) names each run
by its setting and round (``50us_1``, ``10ms_1``, ...). An entry is ``bsp``, ``dispatch``, a variant or a
peer; a run without that entry (or where it failed) shows ``-``. Times are µs, the slowest rank's median,
of ``--mode``. The rows are read from each run's ``.rows.jsonl``, which holds the rows a run finished
even when its step's time limit stopped it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotaxer.benchmark.form import op_named
from autotaxer.benchmark.rows import problem_text, row_entries, row_op


def entry_time(row: dict, name: str, mode: str) -> float | None:
    """``name``'s time (µs) at ``mode`` in one bench row, None when the row lacks it."""
    entry = row.get("bsp") if name == "bsp" else row_entries(row).get(name)
    value = (entry or {}).get(mode)
    return float(value) if isinstance(value, int | float) else None


def load_runs(specs: list[str]) -> dict[str, dict[str, dict]]:
    """``NAME=PATH`` -> {name: {key: row}}; ``SystemExit`` naming a malformed spec or an unreadable line."""
    runs: dict[str, dict[str, dict]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"error: {spec!r}: expected NAME=ROWS.jsonl")
        rows: dict[str, dict] = {}
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise SystemExit(f"error: {path}: {exc.strerror}") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                missing = [f for f in op_named(row_op(row)).shape_fields if f not in row]
                if missing:
                    raise KeyError(missing[0])
                rows[problem_text(row, compact=True)] = row
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise SystemExit(f"error: {path}, line {n}: not a bench row") from None
        runs[name] = rows
    return runs


def table(runs: dict[str, dict[str, dict]], entries: list[str], mode: str) -> list[str]:
    """Markdown lines: a row per key (in the first run's order, then keys only later runs have) and entry."""
    keys: list[str] = []
    for rows in runs.values():
        keys += [k for k in rows if k not in keys]
    lines = ["| key | entry | " + " | ".join(runs) + " |", "|---|---|" + "---|" * len(runs)]
    for key in keys:
        for name in entries:
            cells = []
            for rows in runs.values():
                t = entry_time(rows[key], name, mode) if key in rows else None
                cells.append("-" if t is None else f"{t:.1f}")
            label = name
            if name == "dispatch":
                present = [rows[key] for rows in runs.values() if key in rows]
                served = sorted({str(r.get("dispatch", {}).get("variant")) for r in present})
                label += " (" + "/".join(served) + ")"
            lines.append(f"| {key} | {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=ROWS.jsonl")
    ap.add_argument("--entries", default="dispatch", help="comma-separated: bsp, dispatch, variants or peers")
    ap.add_argument("--mode", choices=("eager", "graph"), default="graph")
    args = ap.parse_args(argv)
    entries = [e.strip() for e in args.entries.split(",") if e.strip()]
    if not entries:
        raise SystemExit("error: --entries: name at least one entry")
    print("\n".join(table(load_runs(args.runs), entries, args.mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
