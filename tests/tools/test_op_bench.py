"""``bench/op_bench.py``: the cases of each op from ``NxK`` and ``M`` lists (the op's own layout field), a
clear error for a layout the op has not, and ``--summarize`` over a stored run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("op_bench", ROOT / "bench" / "op_bench.py")
op_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_bench)
STORED = ROOT / "tests" / "cli" / "data" / "ag_gemm_quick_h200x2_run1.json"


@pytest.mark.parametrize("op, field", [("ag_gemm", "gather_dim"), ("gemm_rs", "scatter_dim")])
def test_cases_carry_the_ops_layout_field(op: str, field: str) -> None:
    cfg, out = op_bench.parse_args(["--op", op, "--shapes", "8192x8192,8192x28672", "--m", "16,256"])
    assert out == "op_bench.json" and len(cfg.cases) == 2 * 2 * 2
    assert {c.op for c in cfg.cases} == {op}
    assert sorted({dict(c.layout)[field] for c in cfg.cases}) == [0, 1]
    assert {dict(c.shape)["K"] for c in cfg.cases} == {8192, 28672}


def test_a_layout_the_op_has_not_is_named(capsys) -> None:
    with pytest.raises(SystemExit):
        op_bench.parse_args(["--op", "gemm_rs", "--layouts", "2"])
    assert "--layouts: scatter_dim must be 0 or 1" in capsys.readouterr().err


def test_summarize_a_stored_run(capsys) -> None:
    assert op_bench.main(["--summarize", str(STORED)]) == 0
    text = capsys.readouterr().out
    table = [line for line in text.splitlines() if line.startswith("| 8192 |")]
    assert len(table) == 8 and "geometric means over 8 rows" in text
    assert all("copy_engine" in line for line in table)
