"""``copy_engine_split`` on CPU: its N-split GEMM schedule run with plain torch on every rank of 2-4
ranks (each output element written once, the product equal to the fp64 reference), the column split,
and the variant's space, checks and seeds. The CUDA schedule (copy-engine transport) runs in the GPU
tests (``tests/test_ag_gemm_gpu.py``)."""

from __future__ import annotations

import pytest
import torch
from autotaxer.kernels.ag_gemm_ce_split import COLUMN_ALIGN, first_columns, schedule

from autotaxer._problem import ProblemKey, Target
from autotaxer.ops import get_op, iter_grid

H200 = Target("nvidia-h200", "sm_90", 132)


def _key(m: int, n: int, gd: int = 0, ws: int = 2) -> ProblemKey:
    shape = {"M": m, "N": n, "K": 256}
    return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", shape, {"gather_dim": gd})


@pytest.mark.parametrize("ws", [2, 3, 4])
@pytest.mark.parametrize(("rows", "n", "fraction"), [(5, 384, 0.5), (16, 1000, 0.375), (1, 256, 0.75)])
def test_schedule_computes_the_product_writing_each_element_once(ws, rows, n, fraction) -> None:
    gen = torch.Generator().manual_seed(ws * 1000 + rows)
    k = 24
    a_full = torch.randn(ws * rows, k, generator=gen, dtype=torch.float64)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64)
    n_first = first_columns(n, fraction)
    for rank in range(ws):
        out = torch.full((ws * rows, n), float("nan"), dtype=torch.float64)
        writes = torch.zeros(ws * rows, n, dtype=torch.int32)
        before, after = schedule(rank, ws, rows, n, n_first)
        assert all(st.local and st.rows == (rank * rows, (rank + 1) * rows) for st in before)
        a_shard = a_full[rank * rows : (rank + 1) * rows]
        for st in [*before, *after]:
            (lo, hi), (c0, c1) = st.rows, st.cols
            src = a_shard if st.local else a_full[lo:hi]
            out[lo:hi, c0:c1] = src @ b[:, c0:c1]
            writes[lo:hi, c0:c1] += 1
        assert torch.equal(writes, torch.ones_like(writes)), (ws, rank)
        assert torch.allclose(out, a_full @ b, rtol=1e-12, atol=1e-12), (ws, rank)


def test_first_columns_rounds_to_blocks_and_keeps_both_parts() -> None:
    assert first_columns(8192, 0.375) == 3072
    assert first_columns(7168, 0.375) == 2688  # 21 blocks of 128
    assert first_columns(256, 0.125) == COLUMN_ALIGN  # at least one block
    assert first_columns(384, 0.9) == 2 * COLUMN_ALIGN  # leaves one block
    for bad_n, bad_f in ((255, 0.5), (8192, 0.0), (8192, 1.0)):
        with pytest.raises(ValueError):
            first_columns(bad_n, bad_f)


def test_variant_refuses_gather_dim_1_and_narrow_n() -> None:
    v = get_op("ag_gemm").variants["copy_engine_split"]
    params = {"first_cols": 0.375, "signal": "triton", "order": "rotated"}
    assert "gather_dim=1" in v.check(_key(512, 8192, gd=1), H200, params)
    assert "N" in v.check(_key(512, 200), H200, params)
    assert v.check(_key(512, 8192), H200, params) is None
    assert "missing" in v.check(_key(512, 8192), H200, {"first_cols": 0.375})


def test_seeds_are_points_of_the_space() -> None:
    v = get_op("ag_gemm").variants["copy_engine_split"]
    for ws in (2, 4):
        key = _key(1024, 8192, ws=ws)
        points = list(iter_grid(v.search_space(key, H200)))
        seeds = v.seed_configs(key, H200)
        assert seeds and all(s in points for s in seeds)
