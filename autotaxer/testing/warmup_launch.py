"""A model launch that warms up, for the tests of launches (``tests/runtime/test_warmup_launches.py``).

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
        python -m autotaxer.testing.warmup_launch --db sqlite:///t.sqlite --m 16,32 --out report.json

Every rank joins the default process group (gloo, ``env://``), builds a runtime on ``--db`` (no shipped
or environment tables), runs a step that dispatches ``ag_gemm`` at each ``--m`` (``N = K = 8``, both
gather dims), warms up, checks that every key serves the BSP result after it, and rank 0 writes the
report and what dispatch then served to ``--out`` (JSON). :func:`start` starts such a launch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

#: This module, as ``python -m`` runs it.
MODULE = "autotaxer.testing.warmup_launch"


def start(db: str, ms: str, out: Path, data: Path, world_size: int = 2) -> list[subprocess.Popen]:
    """Start one launch of ``world_size`` ranks of this module (as torchrun would: ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT`` on a free port), its default database and data under ``data``."""
    from . import free_port

    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1", "AUTOTAXER_DB": f"sqlite:///{data}/default.sqlite",
            "XDG_DATA_HOME": str(data),
        }  # fmt: skip
        cmd = [
            sys.executable,
            "-m",
            "autotaxer.testing.warmup_launch",
            "--db",
            db,
            "--m",
            ms,
            "--out",
            str(out),
        ]
        pipe = subprocess.PIPE
        procs.append(subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True))
    return procs


def _step(ws: int, rank: int, ms: list[int]) -> tuple[Any, list[tuple]]:
    """The step and its calls' inputs: ``ag_gemm`` at each M, gather dims 0 and 1."""
    import torch

    import autotaxer

    gen = torch.Generator().manual_seed(7)
    b = torch.randn(8, 8, generator=gen)
    calls = []
    for m in ms:
        full = torch.randn(m, 8, generator=gen)
        calls.append((full.chunk(ws, 0)[rank].contiguous(), b, 0, full))
        calls.append((full.chunk(ws, 1)[rank].contiguous(), b, 1, full))

    def step() -> None:
        for a, bb, dim, _ in calls:
            autotaxer.dispatch("ag_gemm", a, bb, gather_dim=dim)

    return step, calls


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    import autotaxer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--m", default="16", help="comma-separated M of the step's ag_gemm calls")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--fleet-wait", type=float, default=60.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, ws = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    config = autotaxer.RuntimeConfig(
        db_url=args.db, shipped_tables=False, env_tables=False, persist_misses=False
    )
    runtime = autotaxer.init(config)
    step, calls = _step(ws, rank, [int(m) for m in args.m.split(",")])
    report = autotaxer.warmup(
        step,
        budget_s=args.budget,
        trials=args.trials,
        fleet_wait_s=args.fleet_wait,
        variants=("cpu_chunked",),
    )
    worst = 0.0
    for a, b, dim, full in calls:  # what the winners compute is what BSP computes
        got = autotaxer.dispatch("ag_gemm", a, b, gather_dim=dim)
        worst = max(worst, (got - full @ b).abs().max().item())
    served = {k.text: [d.variant, d.source] for k, d in runtime.decisions().items()}
    if rank == 0 and args.out:
        doc = {"pid": os.getpid(), "results": [r.__dict__ for r in report.results], "seen": report.seen}
        with open(args.out, "w") as f:
            json.dump({**doc, "served": served, "max_error": worst}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
