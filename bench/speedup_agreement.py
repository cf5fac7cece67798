"""Does a stored speedup hold in the layer? Per key: the record, the per-call replay, the step's gain.

    python3 -P bench/layer.py --write-shapes layer.csv --world-size 2 --cases fwd:256,fwd:4096
    python3 -P -m autotaxer tune --world-size 2 --shapes layer.csv --db sqlite:///layer.sqlite --timeout 45
    torchrun --nproc-per-node 2 bench/layer.py --cases fwd:256,fwd:4096 --db sqlite:///layer.sqlite \
        --modes plain_compile,autotaxer_compile,async_tp,async_tp_autotaxer --out layer.json
    python3 -P bench/speedup_agreement.py --layer layer.json --db sqlite:///layer.sqlite --out agreement.json

For every fused-op call async TP's compiled code made (``layer.json``'s ``async_tp_calls``: each call
replayed alone, torch's kernel against autotaxer's), the key's record in the database: its confirmed
speedup over torch's fused op (``env["confirmed_us"]``; over the fastest BSP form where torch's op was not
measured) against the replay's ratio; ``agree`` when they are within ``--within`` (3%). Per case, the
step's gain (``async_tp`` over ``async_tp_autotaxer``) against the gain the replays predict: the step less
each of its calls' replayed saving (a call of the case = its key's ``M`` is the case's rows, ``S * batch``;
one call per signature and step is assumed, which holds for the forward of one layer), and, where both ran,
``plain_compile`` over ``autotaxer_compile``. Records that were not confirmed show no ratio (the tuner's
best trial against one BSP sample). The replay (``bench/async_tp_check.py``) times each call waiting for
the last one's output, as the tuner does unless a key was tuned with ``--chain back-to-back``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", required=True, help="bench/layer.py's --out (with async_tp_autotaxer)")
    ap.add_argument("--db", required=True, help="the database the layer's warm-up stored its winners in")
    ap.add_argument("--within", type=float, default=0.03, help="relative difference that still agrees")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    return ap.parse_args(argv)


def key_rows(calls: list[dict[str, Any]], db: Any, within: float) -> list[dict[str, Any]]:
    """Per replayed call: its key, the record's confirmed speedups and the replay's ratio."""
    from autotaxer import ProblemKey
    from autotaxer.records import confirmed_times, is_confirmed

    rows = []
    for c in calls:
        row: dict[str, Any] = {"op": c["op"], "key": c["key"], "served": c["served"]}
        row["replay"] = c["torch_ms"] / c["autotaxer_ms"]
        row["saving_ms"] = c["torch_ms"] - c["autotaxer_ms"]
        rec = db.get_winner(ProblemKey.from_text(c["key"])) if c["key"] else None
        if rec is None:
            rows.append({**row, "note": "no record in the database"})
            continue
        times = confirmed_times(rec.env)
        row.update(variant=rec.variant, confirmed=is_confirmed(rec.env), chain=rec.env.get("chain"))
        if row["confirmed"]:
            row["stored_x_bsp"] = rec.speedup
            base = "torch_fused" if "torch_fused" in times else None
            row["stored_x_torch"] = times[base] / rec.median_us if base else None
            stored = row["stored_x_torch"] if base else rec.speedup
            row["agree"] = abs(stored / row["replay"] - 1) <= within
        rows.append(row)
    return rows


def case_rows(results: dict[str, Any], keys: list[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """Per case: the step's measured gain and the gain its calls' replayed savings predict."""
    from autotaxer import ProblemKey

    out = []
    for case, modes in results.items():
        if case == "async_tp_calls" or ":" not in case:
            continue
        base, mine = modes.get("async_tp", {}).get("ms"), modes.get("async_tp_autotaxer", {}).get("ms")
        if base is None or mine is None:
            continue
        rows = int(case.split(":")[1]) * batch
        saving = sum(k["saving_ms"] for k in keys if k["key"] and ProblemKey.from_text(k["key"])["M"] == rows)
        row = {"case": case, "async_tp_ms": base, "autotaxer_ms": mine, "step_gain": base / mine,
               "predicted_gain": base / (base - saving) if base > saving else None}  # fmt: skip
        plain, layers = modes.get("plain_compile", {}).get("ms"), modes.get("autotaxer_compile", {}).get("ms")
        if plain is not None and layers is not None:  # autotaxer's layers compiled, against torch.compile
            row["compile_gain"] = plain / layers
        out.append(row)
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from autotaxer.storage import open_database

    with open(args.layer) as f:
        layer = json.load(f)
    calls = layer["results"].get("async_tp_calls")
    if not calls:
        why = "no async_tp_calls (run bench/layer.py with the mode async_tp_autotaxer)"
        print(f"error: {args.layer}: {why}", file=sys.stderr)
        return 2
    with open_database(args.db, read_only=True) as db:
        keys = key_rows(calls, db, args.within)
    cases = case_rows(layer["results"], keys, layer["config"]["batch"])
    for k in keys:
        stored = _x(k.get("stored_x_torch") or k.get("stored_x_bsp")) if k.get("confirmed") else "unconfirmed"
        agree = {True: "agree", False: "DIFFER"}.get(k.get("agree"), "-")
        print(f"{k['key']}: {k.get('variant', '-')} stored {stored} (x bsp {_x(k.get('stored_x_bsp'))}), "
              f"replay {_x(k['replay'])} served={k['served']} {agree} {k.get('note', '')}")  # fmt: skip
    for c in cases:
        print(f"{c['case']}: step {_x(c['step_gain'])}, predicted by the replays {_x(c['predicted_gain'])}, "
              f"compiled layers over torch.compile {_x(c.get('compile_gain'))}")  # fmt: skip
    if args.out:
        doc = {"layer": args.layer, "db": args.db, "within": args.within, "keys": keys, "cases": cases}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
