"""One-rank timing helpers of the bench scripts: side-by-side medians, and the fused kernel at one rank
(every row local, no peer), for comparing its GEMM with cuBLAS and with other kernels on one GPU."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def ms_per_call(fn: Callable[[], object], reps: int) -> float:
    """Milliseconds per call of ``reps`` back-to-back calls of ``fn``: CUDA events on the current stream
    around them, then a device synchronisation."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def interleaved(fns, reps: int = 50, rounds: int = 7) -> list[float]:
    """Median ms per call of each of ``fns``, timed side by side: warm-up, then ``rounds`` rounds of one
    ``reps``-call sample of each, the order rotated each round (clock drift falls on all alike)."""
    for fn in fns:
        for _ in range(3):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in order[r % len(order) :] + order[: r % len(order)]:
            times[i].append(ms_per_call(fns[i], reps))
    return [statistics.median(t) for t in times]


def fused_one_rank(a, b, out, cfg, comm_sms: int, kind: str = "push"):
    """A call of the fused ``push`` (or ``push_tma``) kernel for one rank (gather_dim=0, every row local) at
    ``cfg``'s tiles."""
    import torch

    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape
    from autotaxer.kernels.ag_gemm.push import ag_gemm_push
    from autotaxer.kernels.ag_gemm.push_tma import ag_gemm_push_tma
    from autotaxer.kernels.common.gemm import num_sms

    launch = ag_gemm_push_tma if kind == "push_tma" else ag_gemm_push
    m, k = a.shape
    config = FusedConfig(
        block_m=cfg.block_m, block_n=cfg.block_n, block_k=cfg.block_k, group_m=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, comm_sms=comm_sms, row_chunks=4, k_chunks=1,
    )  # fmt: skip
    inbox = torch.empty(inbox_shape(m, k, 1), dtype=a.dtype, device=a.device)
    flags = torch.zeros(flags_count(geometry(config, m, k), 1), dtype=torch.int32, device=a.device)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=a.device)
    heap_bases = torch.tensor([inbox.data_ptr()], dtype=torch.int64, device=a.device)
    cache: dict = {}
    return lambda: launch(
        a_shard=a, b=b, out=out, inbox=inbox, flags=flags, sync=sync, heap_bases=heap_bases, rank=0,
        world_size=1, gather_dim=0, config=config, num_sms=num_sms(a.device), cache=cache,
    )  # fmt: skip
