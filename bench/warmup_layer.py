"""The layer benchmark's layer warmed up where no table applies: before, the warm-up, after, offline-tuned.

    torchrun --nproc-per-node 2 bench/warmup_layer.py --case fwd:256 --budget 120 --db sqlite:///w.sqlite \
        --offline-table offline.json --offline-db sqlite:///offline.sqlite --out w.json

On every rank: the layer benchmark's Llama-3-70B-class layer (``bench/layer.py``'s set-up) on a runtime
with no shipped or environment table (``--shipped`` keeps the shipped ones), its database ``--db``. Timed
as ``bench/layer.py`` times (eager, plain PyTorch and autotaxer side by side, median over ``--reps`` of
the slowest rank): before the warm-up (every key missed: BSP), then ``autotaxer.warmup(step,
budget_s=--budget)``, after it, and on ``--offline-table`` alone (the same keys tuned offline by
``autotaxer tune``). Rank 0 prints and writes (``--out``) the times, the warm-up's seconds and per key
its winner, ×fastest BSP form, trials and the trials it took to come within 2% of the best time either
search found (with ``--offline-db``: the offline search's, which starts cold, beside it).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
import torch.distributed as dist

#: What is timed, side by side: plain PyTorch and the layer through autotaxer, eager (bench/layer.py's).
MODES = ("plain_eager", "autotaxer_eager")


def _config(args: Any, **changes: Any) -> Any:
    import autotaxer

    base = dict(shipped_tables=args.shipped, env_tables=False, persist_misses=False)
    return autotaxer.RuntimeConfig(**{**base, **changes})


def _searches(source: str, keys: list[str]) -> dict[str, list]:
    """Per key, the times of its finished trials in the order they ran (None: failed), from a tuning
    database (an SQL URL) or from an ``autotaxer tune --jsonl`` log (``.jsonl`` or ``.jsonl.gz``)."""
    out: dict[str, list] = {}
    if source.endswith((".jsonl", ".jsonl.gz")):
        import gzip

        with (gzip.open if source.endswith(".gz") else open)(source, "rt") as f:
            for line in f:
                event = json.loads(line) if line.startswith("{") else {}
                if event.get("event") == "trial" and event["key"] in keys and event["state"] != "PRUNED":
                    out.setdefault(event["key"], []).append(
                        event["median_us"] if event["state"] == "COMPLETE" else None
                    )
        return out
    import optuna

    from autotaxer.storage import open_database

    with open_database(source, read_only=True) as db:
        storage = db.optuna_storage()
        for key in keys:
            try:
                study = optuna.load_study(study_name=key, storage=storage)
            except KeyError:
                continue
            done = [
                t
                for t in sorted(study.get_trials(), key=lambda t: t.number)
                if t.state.name in ("COMPLETE", "FAIL")
            ]
            out[key] = [t.value if t.state.name == "COMPLETE" else None for t in done]
    return out


def _trials_to_best(sources: dict[str, str], keys: list[str], within: float = 0.02) -> dict[str, dict]:
    """Per key and search: finished trials, in the order they ran, until one within ``within`` of the best
    time any of the searches found for the key (None: never)."""
    runs: dict[str, dict[str, list]] = {}
    for name, source in sources.items():
        for key, values in _searches(source, keys).items():
            runs.setdefault(key, {})[name] = values
    out = {}
    for key, by in runs.items():
        best = min((v for values in by.values() for v in values if v is not None), default=None)
        out[key] = {
            name: {
                "trials": len(values),
                "best_us": min((v for v in values if v is not None), default=None),
                "reached_at": next(
                    (i for i, v in enumerate(values, 1) if v is not None and v <= best * (1 + within)), None
                ),
            }
            for name, values in by.items()
        }
    return out


def _layer_bench() -> Any:
    """``bench/layer.py``, beside this script (the layer benchmark's set-up and timing), loaded from its
    file: no ``sys.path`` entry needed, under ``python3 -P`` too."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("layer_bench", Path(__file__).with_name("layer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    import autotaxer
    from autotaxer.models import LlamaConfig
    from autotaxer.runtime.dispatch import get_runtime

    bench = _layer_bench()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="fwd:256", help="fwd:S (forward) or train:S (forward + backward)")
    ap.add_argument("--budget", type=float, default=120.0, help="warm-up seconds in all")
    ap.add_argument("--trials", type=int, default=24, help="at most per key")
    ap.add_argument("--db", required=True, help="the warm-up's database (start from an empty one)")
    ap.add_argument("--offline-table", default="", help="table of the same keys tuned by autotaxer tune")
    ap.add_argument(
        "--offline-db", default="", help="that tune's database, or its --jsonl log (trials to the best, cold)"
    )
    ap.add_argument("--cold", action="store_true", help="no nearby seeds (the cold search)")
    ap.add_argument("--shipped", action="store_true", help="keep the shipped tables (default: none)")
    ap.add_argument("--out", default="")
    bench.layer_options(ap)
    args = ap.parse_args()
    ((kind, s),) = bench._parse_cases(args.case)
    if kind == "graph":
        raise SystemExit("error: --case: fwd:S or train:S")
    device, dtype = bench.start(args.device)
    rank, ws = dist.get_rank(), dist.get_world_size()
    autotaxer.init(_config(args, db_url=args.db))
    cfg = LlamaConfig(args.hidden, args.heads, args.kv_heads, args.head_dim, args.ffn)
    base = bench.make_layer(cfg, device, dtype, rank)
    x = torch.randn(s // ws, args.batch, cfg.hidden, device=device, dtype=dtype)
    x.requires_grad_(kind == "train")
    grad, params, name = torch.randn_like(x), list(base.parameters()), dist.group.WORLD.group_name
    steps = {m: bench._Step(bench._build(m, base, name), params, kind, x, grad) for m in MODES}
    timed = lambda *modes: {m: r.get("ms") for m, r in bench._time_case(  # noqa: E731
        {m: steps[m] for m in modes}, args.reps, args.warmup).items()}  # fmt: skip

    times = {"before": timed(*MODES)}  # every key missed: BSP
    t0 = time.monotonic()
    report = autotaxer.warmup(
        steps["autotaxer_eager"], budget_s=args.budget, trials=args.trials, seed_nearby=not args.cold,
        progress=rank == 0,
    )  # fmt: skip
    warm_s = time.monotonic() - t0
    times["after"] = timed(*MODES)
    served = {k.text: [d.variant, d.source] for k, d in get_runtime().decisions().items()}
    if args.offline_table:
        autotaxer.init(_config(args, tables=(args.offline_table,)))
        times["offline"] = timed(*MODES)
    if rank == 0:
        _report(args, report, times, warm_s, served, ws, device)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _report(args: Any, report: Any, times: dict, warm_s: float, served: dict, ws: int, device: Any) -> None:
    """Print the times and each key's search, and write them all to ``--out``."""
    auto = {label: t.get("autotaxer_eager") for label, t in times.items()}
    offline = auto.get("offline")
    doc = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "world_size": ws,
        "case": args.case,
        "budget_s": args.budget,
        "seeded": not args.cold,
        "times_ms": times,
        "after_vs_offline": offline / auto["after"] if offline and auto["after"] else None,
        "warmup_s": warm_s,
        "step_s": report.step_s,
        "tuning_s": report.tuning_s,
        "check_s": report.check_s,
        "keys": [{**r.__dict__, "speedup": r.speedup} for r in report.results],
        "in_step_checks": [c.__dict__ for c in report.checks],
        "trials_to_best": _trials_to_best(
            {"warm_up": args.db, **({"offline": args.offline_db} if args.offline_db else {})},
            [r.key for r in report.results],
        ),
        "served_after": served,
    }
    shown = ("times_ms", "after_vs_offline", "warmup_s", "tuning_s", "check_s", "in_step_checks")
    print(json.dumps({k: doc[k] for k in shown}, indent=1))
    for key, by in doc["trials_to_best"].items():
        print(key, {n: (v["reached_at"], v["trials"]) for n, v in by.items()})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    raise SystemExit(main())
