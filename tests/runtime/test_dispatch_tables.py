"""Runtime table sources: merge precedence, device-type filter, strict mode and stale-record reports."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from autotaxer import ProblemKey
from autotaxer._target import cpu_target
from autotaxer.records import WinnerRecord
from autotaxer.runtime import table as table_mod
from autotaxer.runtime.dispatch import RuntimeConfig
from autotaxer.runtime.kernel_hash import kernel_source_hash
from autotaxer.runtime.table import TableSources, load_table, stale_report, table_digest
from autotaxer.table_file import TableFileError, write_table

TARGET = cpu_target()
ENV = {"torch": "2.13.0", "triton": "3.9.0", "iris": "0.0.1"}


def key(m: int) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": m, "N": 32, "K": 16}, {"gather_dim": 0})


def rec(m: int, chunks: int, median_us: float = 5.0, **kw) -> WinnerRecord:
    fields = {"env": dict(ENV), "device_type": "cpu", **kw}
    return WinnerRecord(
        key(m), "cpu_chunked", {"chunks": chunks, "order": "rotated"}, median_us, 10.0, 4, **fields
    )


def chunks_by_m(t) -> dict[int, int]:
    return {k["M"]: r.params["chunks"] for k, r in t.records.items()}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    folder = tmp_path / "shipped"
    folder.mkdir()
    monkeypatch.setattr(table_mod, "shipped_table_dir", lambda: folder)
    return folder


def test_precedence_paths_then_env_then_database_then_shipped(tmp_path, shipped) -> None:
    from autotaxer.storage import open_database

    write_table([rec(8, 1), rec(16, 1), rec(24, 1), rec(32, 1)], shipped / "defaults.json")
    url = f"sqlite:///{tmp_path}/t.sqlite"
    db = open_database(url)
    db.upsert_winners([rec(8, 2), rec(16, 2), rec(24, 2)])
    db.close()
    write_table([rec(8, 4), rec(16, 4)], tmp_path / "env.json")
    write_table([rec(8, 8)], tmp_path / "explicit.json")
    environ = {"AUTOTAXER_TABLE": str(tmp_path / "env.json")}
    cfg = TableSources(tables=(str(tmp_path / "explicit.json"),), db_url=url)
    t = load_table(cfg, TARGET, env=ENV, environ=environ)
    assert chunks_by_m(t) == {8: 8, 16: 4, 24: 2, 32: 1}
    assert t.origins[key(8)] == str(tmp_path / "explicit.json")
    assert t.origins[key(32)].startswith("shipped:")
    # each source can be switched off
    t = load_table(
        TableSources(db_url=url, env_tables=False, shipped_tables=False), TARGET, env=ENV, environ=environ
    )
    assert chunks_by_m(t) == {8: 2, 16: 2, 24: 2}


def test_earlier_paths_win_and_env_holds_several_entries(tmp_path, shipped) -> None:
    write_table([rec(8, 1), rec(16, 1)], tmp_path / "a.json")
    write_table([rec(8, 2), rec(24, 2)], tmp_path / "b.json")
    folder = tmp_path / "dir"
    folder.mkdir()
    write_table([rec(8, 4), rec(40, 4)], folder / "c.json")
    t = load_table(
        TableSources(tables=(str(tmp_path / "b.json"), str(tmp_path / "a.json"))), TARGET, env=ENV, environ={}
    )
    assert chunks_by_m(t) == {8: 2, 16: 1, 24: 2}
    environ = {"AUTOTAXER_TABLE": os.pathsep.join([str(tmp_path / "a.json"), "", str(folder)])}
    t = load_table(TableSources(), TARGET, env=ENV, environ=environ)
    assert chunks_by_m(t) == {8: 1, 16: 1, 40: 4}


def test_records_of_another_device_type_are_dropped(tmp_path, shipped) -> None:
    write_table([rec(8, 1, device_type="cuda"), rec(16, 2)], shipped / "t.json")
    t = load_table(TableSources(), TARGET, env=ENV, environ={})
    assert chunks_by_m(t) == {16: 2}


def test_timing_keeps_only_records_measured_that_way(tmp_path, shipped) -> None:
    graph = {**ENV, "timing": "graph"}
    write_table(
        [rec(8, 1), rec(16, 2, env={**ENV, "timing": "eager"}), rec(32, 4, env=graph)], shipped / "t.json"
    )
    # a higher source with a graph record of M=8 hides nothing for eager users
    write_table([rec(8, 8, env=graph)], tmp_path / "mine.json")
    sources = {"tables": (str(tmp_path / "mine.json"),)}
    assert chunks_by_m(load_table(TableSources(**sources), TARGET, env=ENV, environ={})) == {
        8: 8,
        16: 2,
        32: 4,
    }
    eager = load_table(TableSources(**sources, timing="eager"), TARGET, env=ENV, environ={})
    assert chunks_by_m(eager) == {8: 1, 16: 2}  # unstamped records count as eager
    graph_only = load_table(TableSources(**sources, timing="graph"), TARGET, env=ENV, environ={})
    assert chunks_by_m(graph_only) == {8: 8, 32: 4}
    with pytest.raises(ValueError, match="timing"):
        TableSources(timing="replay").validate()
    # one source (a folder) with both modes of a key: any-mode users get the eager record, not the
    # smaller median
    both = tmp_path / "both"
    both.mkdir()
    write_table([rec(64, 1, median_us=9.0)], both / "eager.json")
    write_table([rec(64, 2, median_us=3.0, env=graph)], both / "graph.json")
    one = {"tables": (str(both),), "shipped_tables": False}
    assert chunks_by_m(load_table(TableSources(**one), TARGET, env=ENV, environ={})) == {64: 1}
    assert chunks_by_m(load_table(TableSources(**one, timing="graph"), TARGET, env=ENV, environ={})) == {
        64: 2
    }


def test_stale_records_warned_once_and_reported(tmp_path, shipped) -> None:
    fresh_hash = kernel_source_hash("ag_gemm", "cpu_chunked")
    records = [
        rec(8, 1, kernel_hash="0" * 64),
        rec(16, 2, env={**ENV, "torch": "1.0.0"}),
        rec(24, 4, kernel_hash=fresh_hash),
        rec(32, 8),  # no hash recorded: cannot be judged stale
    ]
    write_table(records, shipped / "t.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = load_table(TableSources(), TARGET, env=ENV, environ={})
    assert chunks_by_m(t) == {8: 1, 16: 2, 24: 4, 32: 8}  # non-strict keeps them
    assert len([w for w in caught if "tuned with other kernel sources" in str(w.message)]) == 1
    reasons = {s.key["M"]: s.reasons for s in t.stale}
    assert set(reasons) == {8, 16}
    assert "kernel sources changed" in reasons[8][0]
    assert reasons[16] == ("torch 1.0.0 -> 2.13.0",)
    assert {s.key["M"] for s in stale_report(records, ENV)} == {8, 16}


def test_strict_mode_refuses_stale_records_and_lower_sources_take_over(tmp_path, shipped) -> None:
    write_table([rec(8, 1), rec(16, 1)], shipped / "t.json")
    write_table(
        [rec(8, 2, kernel_hash="f" * 64), rec(16, 2, env={**ENV, "triton": "2.0.0"})], tmp_path / "x.json"
    )
    cfg = TableSources(tables=(str(tmp_path / "x.json"),), strict=True)
    with pytest.warns(RuntimeWarning, match="strict mode refused 2"):
        t = load_table(cfg, TARGET, env=ENV, environ={})
    assert chunks_by_m(t) == {8: 1, 16: 1}
    assert {s.key["M"] for s in t.refused} == {8, 16}
    assert t.stale == ()


def test_duplicate_keys_within_one_source_keep_the_faster(tmp_path, shipped) -> None:
    write_table([rec(8, 1, median_us=9.0)], shipped / "a.json")
    write_table([rec(8, 2, median_us=3.0)], shipped / "b.json")
    t = load_table(TableSources(), TARGET, env=ENV, environ={})
    assert chunks_by_m(t) == {8: 2}


def test_bad_sources_raise_clear_errors(tmp_path, shipped) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "autotaxer-tuning-table", "schema_version": 1, "records": [{"op": 3}]}')
    with pytest.raises(TableFileError, match="bad.json"):
        load_table(TableSources(tables=(str(bad),)), TARGET, env=ENV, environ={})
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_table(TableSources(tables=(str(tmp_path / "missing.json"),)), TARGET, env=ENV, environ={})


def test_init_refuses_a_missing_table_file_by_name(tmp_path) -> None:
    """``autotaxer.init`` with a table path that does not exist fails at once, naming the path (not at
    the first dispatch, inside a collective)."""
    import autotaxer

    missing = tmp_path / "my-gpus.json"
    with pytest.raises(
        ValueError, match=rf"^tables: {re.escape(str(missing))}: no such table file or folder"
    ):
        autotaxer.init(autotaxer.RuntimeConfig(tables=(str(missing),), persist_misses=False))
    assert autotaxer.RuntimeConfig(tables=(str(tmp_path),)).validate() is None  # a folder is a source


def test_digest_depends_on_decisions_only() -> None:
    a = [rec(8, 1, median_us=5.0), rec(16, 2)]
    b = [rec(16, 2), rec(8, 1, median_us=7.0)]  # other order, other timing
    assert table_digest(a) == table_digest(b)
    assert table_digest(a) != table_digest([rec(8, 4), rec(16, 2)])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("heap_size", 0),
        ("max_m_ratio", 0.5),
        ("workspace_cache", 0),
        ("tables", "one.json"),
        ("timing", "both"),
    ],
)
def test_runtime_config_names_the_bad_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=f"{field}:"):
        RuntimeConfig(**{field: value}).validate()


def test_kernel_source_hash_is_stable_and_names_op_and_variant() -> None:
    h = kernel_source_hash("ag_gemm", "bsp")
    assert len(h) == 64 and int(h, 16) >= 0
    assert h == kernel_source_hash("ag_gemm", "bsp")
    assert h != kernel_source_hash("ag_gemm", "cpu_chunked")
    assert h != kernel_source_hash("flash_decode", "bsp")


def test_kernel_hash_ignores_layout_comments_and_docstrings_but_not_code() -> None:
    from autotaxer.runtime.kernel_hash import normalized_source

    base = '''"""Module doc."""
import triton


@triton.jit
def f(x, BLOCK: tl.constexpr):
    """Doc."""
    return x + 1  # one
'''
    relaid = '''"""Another module doc, longer."""

import triton

@triton.jit
def f(
    x,
    BLOCK: tl.constexpr,
):
    # a comment
    return (x
            + 1)
'''
    assert normalized_source(base) == normalized_source(relaid)
    for changed in (
        base.replace("x + 1", "x + 2"),
        base.replace("x + 1", "x - 1"),
        base.replace("BLOCK: tl.constexpr", "BLOCK"),  # a constexpr is part of the kernel
        base.replace("return x + 1", "y = 0\n    return x + 1"),
    ):
        assert normalized_source(changed) != normalized_source(base), changed


def test_kernel_hash_covers_only_the_sources_a_variant_imports() -> None:
    from autotaxer.runtime.kernel_hash import kernel_sources

    push = kernel_sources("ag_gemm", "push")
    assert "autotaxer.kernels.ag_gemm.push" in push and "autotaxer.kernels.ag_gemm.fused" in push
    ce = kernel_sources("ag_gemm", "copy_engine")
    assert "autotaxer.kernels.ag_gemm.copy_engine" in ce and "autotaxer.kernels.common.signal" in ce
    assert not any("push" in m or "pull" in m or "ag_gemm.fused" in m for m in ce)  # push edits: CE fresh
    assert "autotaxer.ops.ag_gemm._op" in kernel_sources("ag_gemm", "bsp")
    with pytest.raises(KeyError, match="no variant"):
        kernel_source_hash("ag_gemm", "no_such_variant")
