"""Dispatch lookup policy (exact, nearest M within a bound, invalid configs skipped, BSP fallback),
miss logging and counting, and the misses export as a shapes.csv the tuner accepts."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from autotaxer import ProblemKey
from autotaxer._target import Target, cpu_target
from autotaxer.ops import get_op
from autotaxer.records import WinnerRecord
from autotaxer.runtime.lookup import EXACT, FALLBACK, NEAREST, decide
from autotaxer.runtime.misses import MissesFileError, read_misses, write_shapes_csv
from autotaxer.shapes import load_shapes
from autotaxer.table_file import write_table

TARGET = cpu_target()
OP = get_op("ag_gemm")


def key(m: int, n: int = 32, k: int = 16, ws: int = 2, dtype: str = "fp32", gd: int = 0, gpu: str = "cpu"):
    return ProblemKey.make("ag_gemm", gpu, ws, dtype, {"M": m, "N": n, "K": k}, {"gather_dim": gd})


def rec(k: ProblemKey, chunks: int = 2, order: str = "rotated", variant: str = "cpu_chunked") -> WinnerRecord:
    params = {"chunks": chunks, "order": order} if variant == "cpu_chunked" else {}
    return WinnerRecord(k, variant, params, median_us=5.0, bsp_us=10.0, trials=4, device_type="cpu")


def table(*records: WinnerRecord) -> dict[ProblemKey, WinnerRecord]:
    return {r.key: r for r in records}


def test_exact_hit_uses_the_tuned_record() -> None:
    t = table(rec(key(64), chunks=4), rec(key(128), chunks=8))
    d = decide(t, key(64), OP, TARGET)
    assert (d.variant, d.params, d.source, d.distance) == (
        "cpu_chunked",
        {"chunks": 4, "order": "rotated"},
        EXACT,
        0,
    )
    assert d.tuned_key == key(64)


def test_nearest_m_within_bound_and_closest_first() -> None:
    t = table(rec(key(64), chunks=1), rec(key(128), chunks=2))
    d = decide(t, key(96), OP, TARGET)  # ln(96/64)=0.405 vs ln(128/96)=0.288
    assert (d.source, d.params["chunks"], d.tuned_key) == (NEAREST, 2, key(128))
    assert d.distance == pytest.approx(math.log(128 / 96))
    d = decide(t, key(72), OP, TARGET)
    assert (d.source, d.tuned_key) == (NEAREST, key(64))


def test_nearest_outside_the_bound_falls_back_to_bsp() -> None:
    t = table(rec(key(64)))
    d = decide(t, key(512), OP, TARGET)
    assert (d.variant, d.source, d.tuned_key) == ("bsp", FALLBACK, None)
    # a wider bound reaches it
    d = decide(t, key(512), OP, TARGET, max_log_distance=math.log(8))
    assert (d.variant, d.source) == ("cpu_chunked", NEAREST)


def test_nearest_needs_a_winner_that_beat_bsp_by_the_margin() -> None:
    close = WinnerRecord(
        key(128), "cpu_chunked", {"chunks": 2, "order": "rotated"}, 9.5, 10.0, 4, device_type="cpu"
    )
    clear = rec(key(64), chunks=4)  # 2x over BSP there
    assert close.speedup == pytest.approx(10 / 9.5)
    d = decide(table(close, clear), key(96), OP, TARGET)  # M=128 is closer but won by 5% only
    assert (d.source, d.tuned_key) == (NEAREST, key(64))
    d = decide(table(close), key(96), OP, TARGET)
    assert (d.variant, d.source) == ("bsp", FALLBACK)
    d = decide(table(close), key(96), OP, TARGET, min_nearest_speedup=1.0)
    assert (d.source, d.tuned_key) == (NEAREST, key(128))
    assert decide(table(close), key(128), OP, TARGET).source == EXACT  # the margin is for neighbours only


def test_config_invalid_for_the_shape_moves_to_the_next_candidate_then_bsp() -> None:
    # M=72, world size 2: shard of 36 rows. chunks=8 (from M=76) does not divide 36; chunks=4 (M=64) does.
    near_invalid, farther_valid = rec(key(76), chunks=8), rec(key(64), chunks=4)
    d = decide(table(near_invalid, farther_valid), key(72), OP, TARGET)
    assert (d.source, d.tuned_key, d.params["chunks"]) == (NEAREST, key(64), 4)
    d = decide(table(near_invalid), key(72), OP, TARGET)
    assert (d.variant, d.source) == ("bsp", FALLBACK)


def test_exact_record_with_unusable_config_or_variant_is_not_used() -> None:
    bad_params = rec(key(64), chunks=3)  # 3 is not in the search space
    assert decide(table(bad_params), key(64), OP, TARGET).source == FALLBACK
    gpu_only = WinnerRecord(key(64), "pull", {}, 5.0, 10.0, 4, device_type="cpu")  # not runnable on CPU
    d = decide(table(gpu_only, rec(key(80), chunks=2)), key(64), OP, TARGET)
    assert (d.source, d.tuned_key) == (NEAREST, key(80))


@pytest.mark.parametrize(
    "other",
    [
        key(64, n=64),
        key(64, k=32),
        key(64, dtype="bf16"),
        key(64, ws=4),
        key(64, gd=1),
        key(64, gpu="nvidia-h200"),
    ],
    ids=["N", "K", "dtype", "world_size", "layout", "gpu_model"],
)
def test_any_other_difference_than_m_falls_back_to_bsp(other: ProblemKey) -> None:
    d = decide(table(rec(other)), key(64), OP, TARGET)
    assert (d.variant, d.source) == ("bsp", FALLBACK)


def test_decision_digest_depends_on_variant_params_and_source() -> None:
    t = table(rec(key(64), chunks=4))
    assert decide(t, key(64), OP, TARGET).digest == decide(dict(t), key(64), OP, TARGET).digest
    assert decide(t, key(64), OP, TARGET).digest != decide(t, key(80), OP, TARGET).digest


# -- misses -----------------------------------------------------------------------------------------
def _runtime(tmp_path, records):
    from autotaxer.runtime.dispatch import Runtime, RuntimeConfig

    path = tmp_path / "t.json"
    write_table(records, path)
    cfg = RuntimeConfig(
        tables=(str(path),), env_tables=False, shipped_tables=False, misses_path=str(tmp_path / "m.jsonl")
    )
    return Runtime(cfg)


def _inputs(m: int, n: int = 32, k: int = 16):
    g = torch.Generator().manual_seed(m)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def test_misses_logged_once_counted_and_exported_as_shapes_csv(tmp_path, caplog) -> None:
    tuned = key(64, ws=1)
    rt = _runtime(tmp_path, [rec(tuned, chunks=2)])
    caplog.set_level(logging.INFO, logger="autotaxer.dispatch")
    calls = {64: 2, 80: 3, 1000: 4}  # exact, nearest, fallback
    for m, n_calls in calls.items():
        a, b = _inputs(m)
        for _ in range(n_calls):
            assert torch.allclose(rt.dispatch("ag_gemm", a, b, gather_dim=0), a @ b, atol=1e-5)
    logged = [r for r in caplog.records if "miss" in r.getMessage()]
    assert len(logged) == 2  # one line per distinct miss, none for the exact hit
    misses = {m.key["M"]: m for m in rt.misses()}
    assert set(misses) == {80, 1000}
    assert (misses[80].calls, misses[80].source, misses[80].variant) == (3, NEAREST, "cpu_chunked")
    assert (misses[1000].calls, misses[1000].source, misses[1000].variant) == (4, FALLBACK, "bsp")
    assert misses[80].tuned_key == tuned.text
    rt.close()
    # rank 0 appended them at shutdown; a second run's misses add up
    rt2 = _runtime(tmp_path, [rec(tuned, chunks=2)])
    a, b = _inputs(80)
    rt2.dispatch("ag_gemm", a, b, gather_dim=0)
    rt2.close()
    on_disk = {m.key["M"]: m.calls for m in read_misses(tmp_path / "m.jsonl")}
    assert on_disk == {80: 4, 1000: 4}
    out = tmp_path / "shapes.csv"
    assert write_shapes_csv(read_misses(tmp_path / "m.jsonl"), out) == 2
    rows = load_shapes(out, world_size=1)
    assert sorted(
        (r.shape["M"], r.shape["N"], r.shape["K"], r.dtype, r.layout["gather_dim"]) for r in rows
    ) == [
        (80, 32, 16, "fp32", 0),
        (1000, 32, 16, "fp32", 0),
    ]


def test_misses_cli_lists_and_writes_shapes(tmp_path) -> None:
    from typer.testing import CliRunner

    from autotaxer.cli import app

    rt = _runtime(tmp_path, [])
    a, b = _inputs(24)
    rt.dispatch("ag_gemm", a, b, gather_dim=0)
    rt.close()
    out = tmp_path / "next.csv"
    res = CliRunner().invoke(
        app, ["misses", "--file", str(tmp_path / "m.jsonl"), "--out", str(out), "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    listed = json.loads(res.stdout)
    assert [m["key"] for m in listed] == [key(24, ws=1).text]
    assert [r.shape["M"] for r in load_shapes(out)] == [24]


def test_misses_table_shows_whole_keys_at_80_columns(tmp_path) -> None:
    """Two misses that differ only at the end of their keys (the layout) read differently at 80 columns,
    and a nearest record is named by what differs from the call (its M)."""
    from typer.testing import CliRunner

    from autotaxer.cli import app

    def text(m: int, gd: int) -> str:
        return f"ag_gemm|nvidia-h200|8|bf16|M={m},N=28672,K=8192|gather_dim={gd},b_layout=nk"

    path = tmp_path / "m.jsonl"
    nearest = {"key": text(16384, 1), "source": "nearest", "variant": "copy_engine", "calls": 12000}
    lines = [{**nearest, "tuned_key": text(8192, 1)}, {"key": text(16384, 0), "source": "fallback",
                                                       "variant": "bsp", "calls": 3}]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    res = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["misses", "--file", str(path)])
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert "…" not in res.output and max(map(len, out[1:])) <= 80, res.output  # [0]: the file's path
    assert "ag_gemm on nvidia-h200, world size 8" in res.output
    assert any("M=16384 N=28672 K=8192 gd=1 nk" in x and "copy_engine, nearest M=8192" in x for x in out)
    assert any("M=16384 N=28672 K=8192 gd=0 nk" in x and "bsp, fallback" in x for x in out)


def test_misses_out_writes_every_ops_shapes_in_one_file(tmp_path) -> None:
    """``misses --out`` writes what its table lists: the misses of every op (``--op``: one op's), and
    says how many of which op it wrote."""
    from typer.testing import CliRunner

    from autotaxer.cli import app

    ag = "ag_gemm|cpu|2|fp32|M=64,N=256,K=256|gather_dim=0,b_layout=nk"
    rs = "gemm_rs|cpu|2|fp32|M=64,N=256,K=256|scatter_dim=0"
    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(
            json.dumps({"key": k, "source": "fallback", "variant": "bsp", "calls": 1}) + "\n"
            for k in (ag, rs)
        )
    )
    out = tmp_path / "next.csv"
    res = CliRunner().invoke(app, ["misses", "--file", str(path), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote 2 shape(s) of ag_gemm, gemm_rs to {out}" in res.output
    assert sorted(r.to_key("cpu", 2).text for r in load_shapes(out)) == sorted([ag, rs])
    res = CliRunner().invoke(app, ["misses", "--file", str(path), "--out", str(out), "--op", "gemm_rs"])
    assert res.exit_code == 0 and f"wrote 1 shape(s) of gemm_rs to {out}" in res.output, res.output
    assert [r.op for r in load_shapes(out)] == ["gemm_rs"]


def test_bad_misses_file_names_file_line_and_field(tmp_path) -> None:
    from typer.testing import CliRunner

    from autotaxer.cli import app

    path = tmp_path / "m.jsonl"
    good = {"key": key(8).text, "source": "fallback", "variant": "bsp", "calls": 1}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "calls": "many"}) + "\n")
    with pytest.raises(MissesFileError, match=r"m\.jsonl:2: field 'calls'"):
        read_misses(path)
    res = CliRunner().invoke(app, ["misses", "--file", str(path), "--out", str(tmp_path / "x.csv")])
    assert res.exit_code == 2
    assert "m.jsonl:2" in res.stderr
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{oops", r"m\.jsonl:2: not valid JSON: Expecting property name .* \(column 2\)"),
        ("[1, 2]", r"m\.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_misses_line_that_is_no_json_object_names_file_and_line(tmp_path, bad: str, message: str) -> None:
    path = tmp_path / "m.jsonl"
    good = {"key": key(8).text, "source": "fallback", "variant": "bsp", "calls": 1}
    path.write_text(json.dumps(good) + "\n" + bad + "\n")
    with pytest.raises(MissesFileError, match=message):
        read_misses(path)


def test_nearest_never_reuses_a_variant_tied_to_its_tuned_size() -> None:
    """ag_gemm's Triton GEMM variants (push, pull, push_tma) are tuned for their M's tile waves: on 4xH200
    M=256's push record (1.19x there) ran 0.75x of BSP at M=128, so a neighbour's push is passed over."""
    assert {"push", "pull", "push_tma"} <= OP.tied_to_size and "copy_engine" not in OP.tied_to_size
    h200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")

    def h200_key(m: int) -> ProblemKey:
        return key(m, n=8192, k=8192, ws=4, dtype="bf16", gpu="nvidia-h200")

    params = {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 4, "num_stages": 4,
              "comm_sms": 0, "row_chunks": 16, "k_chunks": 8, "prefetch_k": 0}  # fmt: skip
    assert OP.variants["push"].check(h200_key(128), h200, params) is None  # valid there: only the rule
    push = WinnerRecord(h200_key(256), "push", params, median_us=78.0, bsp_us=93.1, trials=30)
    d = decide(table(push), h200_key(128), OP, h200)
    assert (d.variant, d.source) == ("bsp", FALLBACK)
    d = decide(table(push), h200_key(256), OP, h200)  # its own M: served exactly
    assert (d.variant, d.source) == ("push", EXACT)
