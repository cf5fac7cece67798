"""The ``gemm_rs`` variants' search spaces and seed configurations, as data: what the tuner explores, and
what it and the benchmark try first. Light: no torch, Triton or Iris imports.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey

#: ``push``, ``push_tma``: the persistent GEMM's tiles; the first choice of each is the default.
FUSED_SPACE: dict[str, tuple[Any, ...]] = {
    "block_m": (128, 64),
    "block_n": (128, 256, 64),
    "block_k": (64, 128),
    "group_m": (8, 4),
    "num_warps": (4, 8),
    "num_stages": (3, 4),
    "num_programs": (0,),
}
#: The persistent GEMM's usual tiles: 128x128 on 4 warps, then 128x256 on 8 (large N).
FUSED_SEEDS: tuple[dict[str, int], ...] = (
    {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 4, "num_stages": 4,
     "num_programs": 0},
    {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 3,
     "num_programs": 0},
)  # fmt: skip

#: ``copy_engine``: side streams the owners are dealt to (at most one per peer), the flags' back end.
CE_STREAMS = (1, 2, 4, 8)
CE_SIGNALS = ("memop", "triton")
#: ``copy_engine`` seeds: every owner on a stream of its own (``"each"``), then one stream; stream memops.
CE_SEEDS: tuple[dict[str, Any], ...] = (
    {"streams": "each", "signal": "memop"},
    {"streams": 1, "signal": "memop"},
)


def copy_engine_space(key: ProblemKey) -> dict[str, tuple[Any, ...]]:
    """``copy_engine``'s space at ``key``: the stream counts that deal its owners differently."""
    from autotaxer.kernels.common.lanes import _streams_reason

    streams = tuple(s for s in CE_STREAMS if _streams_reason(s, key.world_size - 1) is None)
    return {"streams": streams, "signal": CE_SIGNALS}


def copy_engine_seeds(key: ProblemKey) -> list[dict[str, Any]]:
    """:data:`CE_SEEDS` at ``key`` (``"each"``: the largest stream count of its space), repeats dropped."""
    most = copy_engine_space(key)["streams"][-1]
    seeds: list[dict[str, Any]] = []
    for seed in CE_SEEDS:
        seed = dict(seed, streams=most if seed["streams"] == "each" else seed["streams"])
        if seed not in seeds:
            seeds.append(seed)
    return seeds
