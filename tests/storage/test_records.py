"""WinnerRecord: validation, dict round trip, error messages naming where and field."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from _factories import ENV, make_key, make_record

from autotaxer.records import RecordError, WinnerRecord


def test_round_trip_and_speedup():
    rec = make_record(median_us=8.0, bsp_us=12.0)
    d = rec.to_dict()
    assert d["speedup"] == pytest.approx(1.5)
    assert d["shape"] == {"M": 64, "N": 8192, "K": 8192} and d["layout"] == {"gather_dim": 0}
    back = WinnerRecord.from_dict(d, "test")
    assert back == rec
    assert back.speedup == pytest.approx(1.5)


def test_params_and_env_are_plain_dict_copies_and_time_is_utc():
    params = {"BLOCK_M": 64}
    naive = datetime(2026, 1, 2, 3, 4, 5)
    rec = WinnerRecord(make_key(), "pull", params, 1.0, 2.0, 3, measured_at=naive)
    params["BLOCK_M"] = 128
    assert rec.params == {"BLOCK_M": 64} and type(rec.params) is dict
    assert rec.measured_at == naive.replace(tzinfo=timezone.utc)
    east = datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert WinnerRecord(make_key(), "pull", {}, 1.0, 2.0, 3, measured_at=east).measured_at == rec.measured_at
    assert rec.measured_at.tzinfo is not None
    assert WinnerRecord(make_key(), "bsp", {}, 1.0, 1.0, 0).measured_at.tzinfo == timezone.utc


@pytest.mark.parametrize(
    "change, field, fragment",
    [
        ({"median_us": 0.0}, "median_us", "positive"),
        ({"bsp_us": float("nan")}, "bsp_us", "positive"),
        ({"median_us": 1e-300}, "median_us", "not a time one call can take"),
        ({"bsp_us": 1e300}, "bsp_us", "not a time one call can take"),
        ({"median_us": float("inf")}, "median_us", "positive finite"),
        ({"trials": -1}, "trials", ">= 0"),
        ({"variant": ""}, "variant", "non-empty"),
        ({"params": {"x": [1, 2]}}, "params", "x:"),
        ({"device_type": "tpu"}, "device_type", "cuda, cpu"),
        ({"env": {"torch": 2}}, "env", "torch"),
    ],
)
def test_constructor_rejects_bad_values(change, field, fragment):
    base = dict(key=make_key(), variant="bsp", params={}, median_us=1.0, bsp_us=1.0, trials=1)
    base.update(change)
    with pytest.raises(RecordError) as e:
        WinnerRecord(**base)
    assert e.value.field == field
    assert fragment in str(e.value)


def test_bad_key_fields_rejected():
    from autotaxer import ProblemKey

    key = ProblemKey.make("ag_gemm", "nvidia h200", 2, "bf16", {"M": 1})
    with pytest.raises(RecordError, match="field 'gpu_model'"):
        WinnerRecord(key, "bsp", {}, 1.0, 1.0, 1)
    key = ProblemKey.make("ag_gemm", "gpu", 2, "int8", {"M": 1})
    with pytest.raises(RecordError, match="field 'dtype'"):
        WinnerRecord(key, "bsp", {}, 1.0, 1.0, 1)
    key = ProblemKey.make("ag_gemm", "gpu", 2, "bf16", {"M": 0})
    with pytest.raises(RecordError, match="field 'shape': M: must be >= 1"):
        WinnerRecord(key, "bsp", {}, 1.0, 1.0, 1)


@pytest.mark.parametrize(
    "change, field, fragment",
    [
        ({"median_us": "fast"}, "median_us", "not a number"),
        ({"median_us": True}, "median_us", "not a number"),
        ({"median_us": -3}, "median_us", "positive"),
        ({"world_size": 0}, "world_size", ">= 1"),
        ({"world_size": 2.5}, "world_size", "not an integer"),
        ({"dtype": "int8"}, "dtype", "bf16"),
        ({"shape": {}}, "shape", "must not be empty"),
        ({"shape": {"M": "8"}}, "shape", "not an integer"),
        ({"shape": "M=8"}, "shape", "expected an object"),
        ({"params": [1]}, "params", "expected an object"),
        ({"measured_at": "yesterday"}, "measured_at", "ISO 8601"),
        ({"trials": "many"}, "trials", "not an integer"),
        ({"bogus": 1}, "bogus", "unknown field"),
        ({"op": "a|b"}, "op", "without '|'"),
    ],
)
def test_from_dict_errors_name_where_and_field(change, field, fragment):
    d = make_record().to_dict()
    d.update(change)
    with pytest.raises(RecordError) as e:
        WinnerRecord.from_dict(d, "table.json: record 4")
    msg = str(e.value)
    assert msg.startswith(f"table.json: record 4: field {field!r}:"), msg
    assert fragment in msg
    assert e.value.field == field


@pytest.mark.parametrize(
    "missing", ["op", "variant", "median_us", "bsp_us", "trials", "shape", "measured_at"]
)
def test_from_dict_missing_field(missing):
    d = make_record().to_dict()
    del d[missing]
    with pytest.raises(RecordError, match=rf"^rec: field '{missing}': missing"):
        WinnerRecord.from_dict(d, "rec")


def test_from_dict_not_an_object():
    with pytest.raises(RecordError, match="expected an object, got list"):
        WinnerRecord.from_dict([1, 2], "rec")  # type: ignore[arg-type]


def test_from_dict_text_values():
    rec = make_record()
    d = {k: str(v) for k, v in rec.to_dict().items()}
    d.update(shape=rec.key.shape_text, layout=rec.key.layout_text, kernel_hash="abc123")
    d.update(params='{"BLOCK_M": 128, "num_warps": 8, "local_first": true, "order": "rotated"}')
    d.update(env=json.dumps(ENV))
    assert WinnerRecord.from_dict(d, "row", text=True) == rec
    d["params"] = "{not json"
    with pytest.raises(RecordError, match="field 'params': not valid JSON"):
        WinnerRecord.from_dict(d, "row", text=True)


def test_records_module_is_light():
    code = "import sys, autotaxer.records; print('sqlalchemy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
