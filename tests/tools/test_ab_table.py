"""``bench/ab_table.py``: bench runs of the same keys side by side (an entry's time per run, the variant
dispatch served, ``-`` where a run lacks the key or the entry; keys as ``autotaxer bench`` prints them), and
its errors on bad input."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "ab_table.py"
_spec = importlib.util.spec_from_file_location("ab_table", SCRIPT)
ab_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_table)


def _row(m: int, dispatch_us: float, push_us: float | None, served: str = "push") -> dict:
    variants = {} if push_us is None else {"push": {"graph": push_us, "eager": push_us + 5}}
    return {
        "op": "ag_gemm", "M": m, "N": 8192, "K": 8192, "gather_dim": 1, "b_layout": "kn",
        "bsp": {"graph": 64.0, "eager": 200.0},
        "dispatch": {"variant": served, "graph": dispatch_us, "eager": dispatch_us + 1},
        "variants": variants,
    }  # fmt: skip


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_runs_side_by_side_per_key_and_entry(tmp_path: Path, capsys) -> None:
    a = _write(tmp_path / "a.jsonl", [_row(128, 990.0, 48.0), _row(256, 60.0, 61.0)])
    b = _write(tmp_path / "b.jsonl", [_row(128, 47.5, 47.0), _row(512, 99.0, None, served="copy_engine")])
    assert ab_table.main(["--entries", "dispatch,push,bsp", f"50us={a}", f"10ms={b}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| key | entry | 50us | 10ms |"
    assert "| ag_gemm 128x8192x8192 gd=1 | dispatch (push) | 990.0 | 47.5 |" in lines
    assert "| ag_gemm 128x8192x8192 gd=1 | push | 48.0 | 47.0 |" in lines
    # a key only one run has, an entry a run lacks
    assert "| ag_gemm 256x8192x8192 gd=1 | push | 61.0 | - |" in lines
    assert "| ag_gemm 512x8192x8192 gd=1 | push | - | - |" in lines
    assert "| ag_gemm 512x8192x8192 gd=1 | dispatch (copy_engine) | - | 99.0 |" in lines
    assert ab_table.main(["--mode", "eager", f"x={a}"]) == 0
    assert "| ag_gemm 128x8192x8192 gd=1 | dispatch (push) | 991.0 |" in capsys.readouterr().out


def test_bad_input_is_named_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row(128, 1.0, 1.0)) + "\n{not json\n")
    no_n = tmp_path / "no_n.jsonl"
    no_n.write_text(json.dumps({k: v for k, v in _row(128, 1.0, 1.0).items() if k != "N"}) + "\n")
    for args, expected in (
        (["nameless"], "'nameless': expected NAME=ROWS.jsonl"),
        ([f"x={tmp_path / 'missing.jsonl'}"], "missing.jsonl: No such file or directory"),
        ([f"x={bad}"], f"{bad}, line 2: not a bench row"),
        ([f"x={no_n}"], f"{no_n}, line 1: not a bench row"),
    ):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert proc.returncode != 0
        assert expected in proc.stderr
        assert "Traceback" not in proc.stderr
