"""The shipped tables in ``tuning_db/``: complete for the shapes they were tuned from, current with the
kernel sources, and served by timing mode (eager by default, graph-timed with ``timing="graph"``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotaxer._target import Target
from autotaxer.records import timing_of
from autotaxer.runtime.table import TableSources, load_table, stale_reasons
from autotaxer.shapes import load_shapes

ROOT = Path(__file__).resolve().parents[2]
H200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")
SHAPE_FILES = {  # world size -> the shape files its tables (both timings) were tuned from
    2: ("shapes_default_table.csv", "shapes_extra.csv", "shapes_flash_decode.csv"),
    4: ("shapes_llm.csv",),
}
GRAPH_ONLY_SHAPE_FILES = {8: ("shapes_llm.csv",)}  # tuned with --timing graph only so far


def _keys(timing: str = "eager") -> set:
    files = {**SHAPE_FILES, **GRAPH_ONLY_SHAPE_FILES} if timing == "graph" else SHAPE_FILES
    return {
        row.to_key(H200.gpu_model, ws)
        for ws, names in files.items()
        for f in names
        for row in load_shapes(ROOT / "examples" / f)
    }


def _table(timing: str | None):
    # env={}: no software-version comparison (CI runs other torch/triton versions than the device did)
    return load_table(TableSources(env_tables=False, timing=timing), H200, env={}, environ={})


@pytest.mark.parametrize("timing", ["eager", "graph"])
def test_every_shipped_shape_has_a_record_of_each_timing(timing: str) -> None:
    table = _table(timing)
    missing = _keys(timing) - set(table.records)
    example = sorted(map(str, missing))[:3]
    assert not missing, f"{len(missing)} shapes without a {timing}-timed record, e.g. {example}"
    assert {timing_of(r.env) for r in table.records.values()} == {timing}


def test_default_serves_the_eager_record_where_both_exist() -> None:
    table = _table(None)
    assert {timing_of(r.env) for k, r in table.records.items() if k in _keys()} == {"eager"}


def test_shipped_records_match_the_current_kernel_sources() -> None:
    """Editing a tuned kernel without re-tuning and re-exporting the tables fails here (dispatch would
    report those records stale, and refuse them in strict mode)."""
    for timing in ("eager", "graph"):
        stale = [(str(k), r.variant, stale_reasons(r, {})) for k, r in _table(timing).records.items()]
        stale = [s for s in stale if s[2]]
        assert not stale, f"{len(stale)} stale {timing} records, e.g. {stale[:2]}"
