"""The GPU search space of the flash_decode variants (BSP and fused share it), its validity check and
the seed configurations the tuner tries first. Light: no torch, Triton or Iris imports.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params
from ._op import local_length

GPU_PARAMS = ("block_n", "splits", "num_warps", "num_stages")
#: Largest world_size * splits the combine accepts (kernels.flash_decode.partials.MAX_PARTIALS).
MAX_PARTIALS = 1024
#: Shared memory per CTA on H100/H200 (227 KiB).
SMEM_BUDGET = 227 * 1024


def gpu_search_space() -> dict[str, tuple[Any, ...]]:
    """KV block size, splits per rank, warps and stages; the first values are the safe default.

    84 points per variant (12 tile combinations, each one more compile in a tuning run). Stages stop at
    3 and warps at 8: nothing deeper was measured. Splits matter most and depend on the shape:
    :func:`seed_params` puts the likely ones first.
    """
    return {
        "block_n": (64, 32, 128),
        "splits": (16, 8, 32, 64, 4, 2, 1),
        "num_warps": (4, 8),
        "num_stages": (2, 3),
    }


#: Positions a split should cover at least (below that the combine costs more than the split saves).
MIN_SPLIT_POSITIONS = 512
#: Split-KV CTAs aimed for per SM (a few waves, so short and long splits even out).
CTAS_PER_SM = 4


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def heuristic_splits(key: ProblemKey, target: Target) -> int:
    """Splits per rank: about ``CTAS_PER_SM`` CTAs per SM over the ``B * Hkv`` (row, KV head) programs,
    clamped to 8..64, and no split shorter than ``MIN_SPLIT_POSITIONS`` positions.

    Checked against the quick sweep of splits 8..64 on 2xH200
    (``bench/results/2026-11-21_flash_decode_quick_h200x2/``, H=32, Hkv=8, D=128): it is the best
    eager split count of BSP or of fused at 10 of the 12 shapes; B=32 wanted 2x at S=128k and 4-8x at
    S=512k, which :func:`seed_params` also seeds (8x is left to the sampler).
    """
    by_ctas = min(max(_pow2_floor(CTAS_PER_SM * target.num_sms // (key["B"] * key["Hkv"])), 8), 64)
    by_length = _pow2_floor(local_length(key) // MIN_SPLIT_POSITIONS)
    return max(1, min(by_ctas, by_length))


#: Splits at least this long (positions) also get a 4x-splits seed (512k contexts liked 32-64 splits).
LONG_SPLIT_POSITIONS = 16384


def seed_params(key: ProblemKey, target: Target) -> list[dict[str, Any]]:
    """Configurations to try first on GPUs, best guess first: the heuristic split count with the default
    tile, twice and half as many splits, four times as many for very long splits, then the heuristic
    count with one more pipeline stage. Points outside the space or invalid for ``key`` are dropped."""
    p = heuristic_splits(key, target)
    counts = [p, 2 * p, p // 2]
    if local_length(key) // p >= LONG_SPLIT_POSITIONS:
        counts.append(4 * p)
    out = [{"block_n": 64, "splits": s, "num_warps": 4, "num_stages": 2} for s in counts if s >= 1]
    out.append({"block_n": 64, "splits": p, "num_warps": 4, "num_stages": 3})
    space = gpu_search_space()
    seeds: list[dict[str, Any]] = []
    for params in out:
        inside = all(params[name] in choices for name, choices in space.items())
        if inside and params not in seeds and check_gpu_params(key, params) is None:
            seeds.append(params)
    return seeds


def check_gpu_params(key: ProblemKey, params: Params) -> str | None:
    """Why ``params`` cannot serve ``key`` (missing, out of range, more splits than KV blocks), or None."""
    missing = set(GPU_PARAMS) - set(params)
    if missing:
        return f"missing parameters: {', '.join(sorted(missing))}"
    bn, splits = params["block_n"], params["splits"]
    if bn not in (16, 32, 64, 128, 256):
        return f"block_n: must be a power of two in 16..256, got {bn}"
    if not isinstance(splits, int) or splits < 1:
        return f"splits: must be a positive integer, got {splits!r}"
    if params["num_warps"] not in (1, 2, 4, 8, 16):
        return f"num_warps: must be 1, 2, 4, 8 or 16, got {params['num_warps']}"
    if not 1 <= params["num_stages"] <= 8:
        return f"num_stages: must be in 1..8, got {params['num_stages']}"
    blocks = -(-local_length(key) // bn)
    if splits > blocks:
        return f"splits: {splits} splits of {bn}-position blocks exceed the {blocks} blocks of a shard"
    if key.world_size * splits > MAX_PARTIALS:
        return f"splits: world_size * splits = {key.world_size * splits} exceeds {MAX_PARTIALS}"
    esize = 4 if key.dtype == "fp32" else 2
    # K and V tiles of every stage but one, plus scratch (checked against sm_90 compiles of the kernel)
    smem = max(params["num_stages"] - 1, 1) * 2 * bn * key["D"] * esize + 16 * 1024
    if smem > SMEM_BUDGET:
        stages = params["num_stages"]
        return f"num_stages: {stages} stages of {bn}x{key['D']} K/V tiles need {smem} B of shared memory"
    return None
