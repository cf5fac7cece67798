"""``bench/timeline.py``: the summary of a made-up device trace (what a call's span, the GEMMs' and the
copies' unions, their overlap, the streams' busy time and the copies' bandwidth come to), and the script
end to end on one CPU process (no device activity: empty summaries, the JSON still written)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "timeline.py"
_spec = importlib.util.spec_from_file_location("timeline_bench", SCRIPT)
timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timeline)


def _event(name: str, ts: float, dur: float, stream: int, cat: str = "kernel", nbytes: int = 0) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "bytes": nbytes},
    }


def test_a_traced_call_sums_up_to_its_gemms_copies_overlap_and_streams() -> None:
    # two calls of 100 µs: a GEMM 0-60 on stream 7, a copy 40-90 on stream 9 (20 µs of it under the GEMM), a
    # wait kernel 60-62; the second call the same, 100 µs later; a CPU op that is no device activity
    one = [
        _event("nvjet_tst_128x256_h_bz_coopA", 0, 60, 7),
        _event("Memcpy PtoP (Device -> Device)", 40, 50, 9, cat="gpu_memcpy", nbytes=10_000_000),
        _event("_wait_kernel", 60, 2, 7),
    ]
    trace = {"traceEvents": [*one, *({**e, "ts": e["ts"] + 100} for e in one), {"ph": "X", "cat": "cpu_op"}]}
    events = timeline.device_events(trace)
    assert len(events) == 6
    got = timeline.summarize(events, calls=2)
    assert got["span_us"] == pytest.approx(95.0)  # 0 .. 190 over two calls
    assert got["gemm_us"] == pytest.approx(60.0) and got["copy_us"] == pytest.approx(50.0)
    assert got["wait_us"] == pytest.approx(2.0) and got["copy_under_gemm_us"] == pytest.approx(20.0)
    assert got["streams_busy_us"] == {"7": pytest.approx(62.0), "9": pytest.approx(50.0)}
    assert got["copy_bytes"] == 10_000_000 and got["copy_gbps"] == pytest.approx(200.0)  # 10 MB in 50 µs
    last = timeline.last_call(events, calls=2)
    assert [(e["kind"], e["start_us"]) for e in last] == [("gemm", 5.0), ("copy", 45.0), ("wait", 65.0)]


def test_unions_merge_overlaps_and_intersections_count_each_stretch_once() -> None:
    a = timeline.union([(0, 10), (5, 20), (30, 40)])
    assert a == [(0, 20), (30, 40)]
    b = timeline.union([(15, 35)])
    assert timeline.intersect(a, b) == pytest.approx(10.0)  # 15-20 and 30-35
    assert timeline.summarize([], calls=3) == {"calls": 3, "span_us": None}


@pytest.mark.parametrize(
    ("name", "cat", "kind"),
    [
        ("ncclDevKernel_AllGather_RING_LL", "kernel", "collective"),
        ("_wait_eq_kernel", "kernel", "wait"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "gemm"),
        ("Memset (Device)", "gpu_memset", "copy"),
        ("elementwise_kernel", "kernel", "other"),
    ],
)
def test_device_events_are_classified_by_name(name: str, cat: str, kind: str) -> None:
    assert timeline.kind_of({"name": name, "cat": cat}) == kind


def test_on_one_cpu_process_it_runs_and_writes_empty_summaries(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "AUTOTAXER_DB": f"sqlite:///{tmp_path}/d.sqlite"}
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--entries",
        "bsp",
        "--M",
        "64",
        "--N",
        "32",
        "--K",
        "32",
        "--calls",
        "2",
    ]
    done = subprocess.run(
        [*cmd, "--json-out", str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["key"].startswith("ag_gemm|cpu|1|fp32|M=64,N=32,K=32") and doc["device"] == "cpu"
    (rank0,) = doc["entries"]["bsp"]
    assert rank0["summary"] == {"calls": 2, "span_us": None} and rank0["last_call"] == []
    assert "span" in done.stdout
