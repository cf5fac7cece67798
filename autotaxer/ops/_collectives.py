"""The bulk-synchronous collectives that several parts use besides the baselines that define them: the
backward passes, the process warm-up and the benchmark's "communication alone" (NCCL/RCCL on GPUs, gloo
on CPU). They stay defined in those baselines' modules, whose code every shipped record of the baseline
is hashed with (``autotaxer.runtime.kernel_hash``): moving them would make those records stale."""

from __future__ import annotations

from .ag_gemm.bsp import all_gather_shards
from .gemm_rs.bsp import reduce_scatter, reduce_scatter_async

__all__ = ["all_gather_shards", "reduce_scatter", "reduce_scatter_async"]
