"""How long a CPU run of ``tune`` or ``bench`` will take, roughly: said before a run that would take
minutes, and a run that would take hours is refused unless ``--yes`` (its shapes are sized for GPUs)."""

from __future__ import annotations

import os
import time
from typing import Any

#: Variant calls per trial on the CPU pipeline: two validations, 1 warm-up and 3 samples of 3 calls,
#: plus the two fp32 references of the validations.
CALLS_PER_TRIAL = 14
#: Estimates above this many seconds are announced.
ANNOUNCE_S = 120.0
#: CPU runs estimated above this many seconds are refused unless ``--yes``.
REFUSE_S = 3600.0


def _flops_per_second(dtype: Any) -> float:
    """Measured: one 256-cube matmul of ``dtype`` on this CPU (a few milliseconds)."""
    import torch

    a = torch.randn(256, 256).to(dtype)
    torch.matmul(a, a)
    start = time.perf_counter()
    torch.matmul(a, a)
    return 2 * 256**3 / max(time.perf_counter() - start, 1e-6)


def _call_seconds(keys: list[Any], world_size: int) -> float:
    """Seconds of one call of each problem key, summed (its op's arithmetic per rank at this CPU's rate
    for the dtype; ops that declare none count nothing); ranks share the cores."""
    from .._problem import torch_dtype
    from ..ops import get_op

    rates: dict[str, float] = {}
    total = 0.0
    for key in keys:
        flops = get_op(key.op).flops_per_rank(key)
        if flops and key.dtype not in rates:
            rates[key.dtype] = _flops_per_second(torch_dtype(key.dtype))
        total += flops / rates[key.dtype] if flops else 0.0
    return total * max(1.0, world_size / (os.cpu_count() or 1))


def cpu_seconds(keys: list[Any], trials: int, world_size: int) -> float:
    """Seconds the CPU pipeline needs for ``trials`` trials of every key."""
    return _call_seconds(keys, world_size) * trials * CALLS_PER_TRIAL


def bench_calls(variants: int, max_configs: int, warmup: int, iters: int, samples: int) -> int:
    """GEMM-sized calls ``bench`` makes per row at most: each variant's sweep (validation with its
    references, then timing), then every entry of the row side by side (BSP, communication alone, GEMM
    alone, the variants and dispatch), each sample led in by one untimed call."""
    sweep = variants * max_configs * (4 + warmup + samples * iters)
    side_by_side = (4 + variants) * (warmup + samples * (iters + 1))
    return sweep + side_by_side


def bench_cpu_seconds(cases: list[Any], world_size: int, calls_per_row: int) -> float:
    """Seconds ``bench`` needs on the CPU pipeline for ``cases`` (:class:`autotaxer.benchmark.case.Case`)."""
    keys = [c.key("cpu", world_size) for c in cases]
    return _call_seconds(keys, world_size) * calls_per_row


def verdict(seconds: float, what: str, yes: bool) -> tuple[str, str] | None:
    """``("refuse", message)`` above :data:`REFUSE_S` without ``yes``, ``("warn", message)`` above
    :data:`ANNOUNCE_S`, else None. ``what``: the run, e.g. ``"these 12 shape(s) x 16 trials"``."""
    if seconds <= ANNOUNCE_S:
        return None
    about = f"the CPU pipeline needs about {_duration(seconds)} for {what}"
    sized = "examples/shapes_cpu.csv is sized for CPUs; the other example shapes are for GPUs"
    if seconds > REFUSE_S and not yes:
        return "refuse", f"{about}: not started (pass --yes to run it anyway); {sized}"
    return "warn", f"warning: {about} (GEMMs of this size take seconds on a CPU); {sized}"


def tune_verdict(keys: list[Any], trials: int, world_size: int, yes: bool) -> tuple[str, str] | None:
    """:func:`verdict` on a CPU ``tune`` of ``keys`` with ``trials`` trials each."""
    seconds = cpu_seconds(keys, trials, world_size)
    return verdict(seconds, f"these {len(keys)} shape(s) x {trials} trials", yes)


def _duration(seconds: float) -> str:
    """``"25 min"``, ``"3.5 h"`` or ``"65 days"``."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
