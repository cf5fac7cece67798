"""The experimental ``push_split`` variant: its kernel under Triton's interpreter (emulated ranks, as in
``test_kernels_interpreter.py``) and its variant-level checks."""

from __future__ import annotations

import pytest

from autotaxer._problem import ProblemKey, Target
from tests.test_kernels_interpreter import _run

H200 = Target("nvidia-h200", "sm_90", 132)

_SPLIT_CHECK = """
from autotaxer.kernels.ag_gemm_split import ag_gemm_split, counters_count, partials_count


def check_split(ws, gd, m, n, k, cfg, split, calls=3, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    heap, ms, ks, geo, buf, flags, syncs = fused_buffers(ws, gd, m, k, cfg, dtype)
    # NaN-poisoned partials: a tile summed from a slot no piece wrote fails
    parts = [torch.full((partials_count(m, n, cfg, split),), float("nan")) for _ in range(ws)]
    counters = [torch.zeros(counters_count(m, n, cfg), dtype=torch.int32) for _ in range(ws)]
    for call in range(1, calls + 1):
        shards, b, outs, ref = fresh_call(ws, gd, ms, ks, m, n, k, dtype)
        for phase in ("stage", "consumers"):  # every rank's pushes before any rank's pieces
            for r in range(ws):
                ag_gemm_split(a_shard=shards[r], b=b, out=outs[r], inbox=buf[r], flags=flags[r],
                              sync=syncs[r], heap_bases=heap.bases, partials=parts[r], counters=counters[r],
                              rank=r, world_size=ws, gather_dim=gd, config=cfg, split=split, num_sms=4,
                              phase=phase)
        for r in range(ws):
            err = ((outs[r].float() - ref).norm() / ref.norm()).item()
            assert err < (1e-5 if dtype == torch.float32 else 2e-3), (ws, gd, call, r, err)
            assert syncs[r].tolist() == [call, 0, 0], syncs[r].tolist()
            # every tile counted exactly `split` pieces per call; never reset
            assert counters[r].eq(call * split).all(), counters[r].tolist()
    print("OK", ws, gd, m, n, k, split)
"""

SMALL = (
    "FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, comm_sms=2,"
    " row_chunks=2, k_chunks=2)"
)


@pytest.mark.slow
def test_split_pieces_sum_to_the_product() -> None:
    """Two producers (which then take pieces) and two consumers over 4-16 tiles in 2 or 4 pieces each:
    gather_dim=0 with shards straddling tiles and K not a multiple of BLOCK_K, gather_dim=1 with the local
    K-slice's pieces first, 3 ranks; several calls on one set of flags and counters."""
    out = _run(
        _SPLIT_CHECK
        + f"""
cfg = {SMALL}
check_split(2, 0, 24, 40, 40, cfg, 2)
check_split(2, 0, 24, 40, 40, cfg, 4, calls=2, dtype=torch.float16)
check_split(2, 1, 20, 40, 48, cfg, 4, calls=2)
check_split(3, 0, 36, 40, 48, cfg, 2, calls=2)
"""
    )
    assert out.count("OK") == 4


def _key(m: int, gd: int, ws: int = 2, k: int = 8192) -> ProblemKey:
    shape = {"M": m, "N": 8192, "K": k}
    return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", shape, {"gather_dim": gd})


def test_split_variant_checks_and_space() -> None:
    from autotaxer.ops import get_op

    variant = get_op("ag_gemm").variants["push_split"]
    assert variant.experimental  # the tuner and the benchmark take it only when named
    key = _key(256, 0)
    space = variant.search_space(key, H200)
    assert 0 not in space["comm_sms"] and space["prefetch_k"] == (0,) and set(space["split"]) == {2, 4, 8}
    seeds = variant.seed_configs(key, H200)
    assert seeds and all(variant.check(key, H200, s) is None for s in seeds)
    good = seeds[0]
    assert "split" in variant.check(key, H200, {k: v for k, v in good.items() if k != "split"})
    assert "power of two" in variant.check(key, H200, dict(good, split=3))
    assert "dedicated producers" in variant.check(key, H200, dict(good, comm_sms=0))
    assert "prefetch_k" in variant.check(key, H200, dict(good, prefetch_k=1024))
    assert "K-slices" in variant.check(_key(192, 1, ws=3, k=6144), H200, dict(good, split=2))
    assert "partials" in variant.check(_key(16384, 0), H200, dict(good, split=8))
    assert "block_n" in variant.check(key, H200, dict(good, block_n=96))  # push's own checks apply
