"""Start close: which tuned configurations a new key's search measures first, and in what order."""

from __future__ import annotations

import math

from autotaxer import ProblemKey
from autotaxer._target import cpu_target
from autotaxer.ops import get_op
from autotaxer.records import WinnerRecord
from autotaxer.tuner.nearby import nearby_configs, nearness, shape_distance
from autotaxer.tuner.study import SearchSpace

OP = get_op("ag_gemm")
TARGET = cpu_target()


def _key(
    m: int, ws: int = 2, gpu: str = "cpu", dtype: str = "fp32", gather_dim: int = 0, op: str = "ag_gemm"
):
    return ProblemKey.make(op, gpu, ws, dtype, {"M": m, "N": 8, "K": 8}, {"gather_dim": gather_dim})


def _rec(key: ProblemKey, variant: str = "cpu_chunked", **params) -> WinnerRecord:
    params = params or {"chunks": 2, "order": "rotated"}
    device = "cpu" if key.gpu_model == "cpu" else "cuda"
    return WinnerRecord(key, variant, params, 10.0, 20.0, 9, device_type=device)


def _seeds(key: ProblemKey, records, limit: int = 3):
    return nearby_configs(key, records, OP, SearchSpace.build(OP, key, TARGET, None), limit)


def test_shape_distance_is_the_sum_of_log_ratios() -> None:
    assert shape_distance(_key(16), _key(16)) == 0.0
    assert math.isclose(shape_distance(_key(16), _key(64)), math.log(4))
    flash = ProblemKey.make("flash_decode", "cpu", 2, "fp32", {"B": 1, "H": 8, "Hkv": 8, "D": 64, "S": 64})
    assert shape_distance(_key(16), flash) == math.inf  # other shape fields: never near


def test_same_gpu_and_world_size_first_then_other_world_sizes_then_other_gpus() -> None:
    key = _key(16)
    far_same = _key(1024)  # same GPU and world size, 64x away
    near_other_ws = _key(16, ws=4)
    near_other_gpu = _key(16, gpu="nvidia-h100")
    order = sorted([near_other_gpu, near_other_ws, far_same], key=lambda k: nearness(key, k))
    assert order == [far_same, near_other_ws, near_other_gpu]
    # within a tier: the same dtype and layout before a nearer shape
    assert nearness(key, _key(1024)) < nearness(key, _key(16, gather_dim=1))
    assert nearness(key, _key(1024)) < nearness(key, _key(16, dtype="bf16"))


def test_nearest_valid_points_first_skipping_repeats_forms_and_other_ops() -> None:
    key = _key(16)  # shard of 8 rows: chunks 1, 2, 4 and 8 are valid
    records = [
        _rec(_key(64), chunks=8, order="ascending"),  # 4x away
        _rec(_key(32), chunks=4, order="rotated"),  # nearest
        _rec(_key(24), chunks=4, order="rotated"),  # a repeat of the nearest's point: skipped
        _rec(_key(8), variant="bsp"),  # a form users have anyway: queued regardless
        _rec(_key(16, op="gemm_rs"), chunks=1, order="rotated"),  # another op
        _rec(_key(16, ws=4), chunks=1, order="ascending"),  # another world size: after the same one's
    ]
    assert _seeds(key, records) == [
        ("cpu_chunked", {"chunks": 4, "order": "rotated"}),
        ("cpu_chunked", {"chunks": 8, "order": "ascending"}),
        ("cpu_chunked", {"chunks": 1, "order": "ascending"}),
    ]
    assert _seeds(key, records, limit=1) == [("cpu_chunked", {"chunks": 4, "order": "rotated"})]


def test_configurations_this_key_cannot_run_are_passed_over() -> None:
    key = _key(8)  # shard of 4 rows: chunks=8 does not divide them
    records = [
        _rec(_key(16), chunks=8, order="rotated"),  # nearest, but invalid at M=8
        _rec(_key(16, gpu="nvidia-h200"), variant="push", BLOCK_M=128),  # a GPU variant: not searched here
        _rec(_key(64), chunks=2, order="ascending"),
    ]
    assert _seeds(key, records) == [("cpu_chunked", {"chunks": 2, "order": "ascending"})]
    assert _seeds(key, []) == []
