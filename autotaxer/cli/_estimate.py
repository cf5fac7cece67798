"""How long a CPU tuning run will take, roughly: said before a run that would take minutes."""

from __future__ import annotations

import os
import time
from typing import Any

#: Variant calls per trial on the CPU pipeline: two validations, 1 warm-up and 3 samples of 3 calls,
#: plus the two fp32 references of the validations.
CALLS_PER_TRIAL = 14
#: Estimates above this many seconds are announced.
ANNOUNCE_S = 120.0


def _flops_per_second(dtype: Any) -> float:
    """Measured: one 256-cube matmul of ``dtype`` on this CPU (a few milliseconds)."""
    import torch

    a = torch.randn(256, 256).to(dtype)
    torch.matmul(a, a)
    start = time.perf_counter()
    torch.matmul(a, a)
    return 2 * 256**3 / max(time.perf_counter() - start, 1e-6)


def cpu_seconds(keys: list[Any], trials: int, world_size: int) -> float:
    """Seconds the CPU pipeline needs for ``trials`` trials of every ``ag_gemm`` key (others: ignored);
    ranks share this machine's cores."""
    from .._problem import torch_dtype

    rates: dict[str, float] = {}
    total = 0.0
    for key in keys:
        if key.op != "ag_gemm":
            continue
        if key.dtype not in rates:
            rates[key.dtype] = _flops_per_second(torch_dtype(key.dtype))
        total += 2.0 * key["M"] * key["N"] * key["K"] / rates[key.dtype]
    share = max(1.0, world_size / (os.cpu_count() or 1))
    return total * trials * CALLS_PER_TRIAL * share


def announcement(keys: list[Any], trials: int, world_size: int) -> str | None:
    """A warning line when the run would take longer than :data:`ANNOUNCE_S`, else None."""
    seconds = cpu_seconds(keys, trials, world_size)
    if seconds <= ANNOUNCE_S:
        return None
    return (
        f"warning: the CPU pipeline needs about {seconds / 60:.0f} min for these {len(keys)} shape(s) x "
        f"{trials} trials (GEMMs of this size take seconds on a CPU); examples/shapes_cpu.csv is sized "
        "for CPUs, GPUs run the real variants"
    )
