"""The layer benchmark's layer warmed up where no table applies: before, the warm-up, after, offline-tuned.

    torchrun --nproc-per-node 2 bench/warmup_layer.py --case fwd:256 --budget 120 --db sqlite:///w.sqlite \
        --offline-table offline.json --offline-db sqlite:///offline.sqlite --out w.json

On every rank: a Llama-3-70B-class :class:`autotaxer.models.TPLlamaLayer` (sequence-parallel TP,
``comm="autotaxer"``) on a runtime with no shipped or environment table (``--shipped`` keeps the shipped
ones), its database ``--db``. Timed (eager, CUDA events around each step after a barrier, median over
``--reps``, the slowest rank): plain PyTorch (functional collectives + ``F.linear``), autotaxer before
the warm-up (every key missed: BSP), then ``autotaxer.warmup(step, budget_s=--budget)``, autotaxer after
it, and autotaxer on ``--offline-table`` alone (the same keys tuned offline by ``autotaxer tune``). Rank 0
prints and writes (``--out``) the times, the warm-up's seconds and per key its winner, ×fastest BSP
form, trials and the trials it took to come within 2% of the best time either search found (with
``--offline-db``: the offline search's, which starts cold, beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist


def _time(step: Any, reps: int, warmup: int) -> float:
    """Median ms of ``step`` over ``reps`` (each after a barrier), the slowest rank's (CUDA events; the
    wall clock on CPU)."""
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    samples = []
    for _ in range(reps):
        dist.barrier()
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        step()
        if cuda:
            end.record()
        sync()
        samples.append(start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3)
    t = torch.tensor([statistics.median(samples)], device="cuda" if cuda else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _config(args: Any, **changes: Any) -> Any:
    import autotaxer

    base = dict(shipped_tables=args.shipped, env_tables=False, persist_misses=False)
    return autotaxer.RuntimeConfig(**{**base, **changes})


def _trials_to_best(urls: dict[str, str], keys: list[str], within: float = 0.02) -> dict[str, dict]:
    """Per key and search: finished trials, in the order they ran, until one within ``within`` of the best
    time any of the searches found for the key (None: never)."""
    import optuna

    from autotaxer.storage import open_database

    runs: dict[str, dict[str, list]] = {}
    for name, url in urls.items():
        with open_database(url, read_only=True) as db:
            storage = db.optuna_storage()
            for key in keys:
                try:
                    study = optuna.load_study(study_name=key, storage=storage)
                except KeyError:
                    continue
                trials = sorted(study.get_trials(), key=lambda t: t.number)
                done = [t for t in trials if t.state.name in ("COMPLETE", "FAIL")]
                values = [t.value if t.state.name == "COMPLETE" else None for t in done]
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


def main() -> int:
    import autotaxer
    from autotaxer.models import LlamaConfig, TPLlamaLayer
    from autotaxer.runtime.dispatch import get_runtime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="fwd:256", help="fwd:S (forward) or train:S (forward + backward)")
    ap.add_argument("--budget", type=float, default=120.0, help="warm-up seconds in all")
    ap.add_argument("--trials", type=int, default=24, help="at most per key")
    ap.add_argument("--db", required=True, help="the warm-up's database (start from an empty one)")
    ap.add_argument("--offline-table", default="", help="table of the same keys tuned by autotaxer tune")
    ap.add_argument("--offline-db", default="", help="that tune's database (trials to the best, cold)")
    ap.add_argument("--cold", action="store_true", help="no nearby seeds (the cold search)")
    ap.add_argument("--shipped", action="store_true", help="keep the shipped tables (default: none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kind, _, s = args.case.partition(":")
    if kind not in ("fwd", "train") or not s.isdigit():
        raise SystemExit(f"error: --case: {args.case!r} is not fwd:S or train:S")
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}.items():
        os.environ.setdefault(k, v)
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, dtype = torch.device("cuda", local), torch.bfloat16
        dist.init_process_group("nccl", device_id=device)
    else:  # a smoke run of the script on gloo (small sizes: --hidden 64 --ffn 128 --heads 8 --kv-heads 2)
        device, dtype = torch.device("cpu"), torch.float32
        dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()

    autotaxer.init(_config(args, db_url=args.db))
    torch.manual_seed(1234 + rank)
    cfg = LlamaConfig(args.hidden, args.heads, args.kv_heads, args.head_dim, args.ffn)
    layer = TPLlamaLayer(cfg, "autotaxer", device=device, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    x = torch.randn(int(s) // ws, args.batch, cfg.hidden, device=device, dtype=dtype)
    x.requires_grad_(kind == "train")
    grad = torch.randn_like(x)

    def step() -> None:
        if kind == "train":
            for p in layer.parameters():
                p.grad = None
            layer(x).backward(grad)
        else:
            with torch.no_grad():
                layer(x)

    times: dict[str, float] = {}
    layer.set_comm("plain")  # what users write today: functional collectives + F.linear
    times["plain"] = _time(step, args.reps, args.warmup)
    layer.set_comm("autotaxer")
    times["before"] = _time(step, args.reps, args.warmup)
    t0 = time.monotonic()
    report = autotaxer.warmup(
        step, budget_s=args.budget, trials=args.trials, seed_nearby=not args.cold, progress=rank == 0
    )
    warm_s = time.monotonic() - t0
    times["after"] = _time(step, args.reps, args.warmup)
    served = {k.text: [d.variant, d.source] for k, d in get_runtime().decisions().items()}
    if args.offline_table:
        autotaxer.init(_config(args, tables=(args.offline_table,)))
        times["offline"] = _time(step, args.reps, args.warmup)
    if rank == 0:
        keys = [r.key for r in report.results]
        urls = {"warm_up": args.db, **({"offline": args.offline_db} if args.offline_db else {})}
        doc = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "world_size": ws,
            "case": args.case,
            "budget_s": args.budget,
            "seeded": not args.cold,
            "times_ms": times,
            "after_vs_offline": times["offline"] / times["after"] if "offline" in times else None,
            "warmup_s": warm_s,
            "step_s": report.step_s,
            "tuning_s": report.tuning_s,
            "keys": [{**r.__dict__, "speedup": r.speedup} for r in report.results],
            "trials_to_best": _trials_to_best(urls, keys),
            "served_after": served,
        }
        print(json.dumps({k: doc[k] for k in ("times_ms", "after_vs_offline", "warmup_s")}, indent=1))
        for key, by in doc["trials_to_best"].items():
            print(key, {n: (v["reached_at"], v["trials"]) for n, v in by.items()})
        if args.out:
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1, default=str)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
