"""Reading benchmark result rows (as :func:`~.run.run_bench` writes them, older files' rows included):
an entry's time, the BSP time every speedup is against, the ceiling, the fastest form; and the printed
lines of a row."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .form import op_named

#: The sign of a speedup in every printed line (``×1.25``), as ``tune`` and ``show`` print it.
SPEEDUP = "×"
#: What rows written before rows named each op's own layout field called the op's dimension.
LEGACY_DIM = "gather_dim"


def best_us(entry: Mapping[str, Any] | None) -> float | None:
    """The faster of an entry's eager and graph times (µs), or None when it has neither."""
    if not entry:
        return None
    vals = [entry.get(m) for m in ("eager", "graph")]
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return min(vals) if vals else None


def bsp_us(row: Mapping[str, Any]) -> float | None:
    """The fastest BSP form of a row at its faster mode: ``bsp`` and every other form the row measured
    (``bsp_forms``, e.g. ``bsp_symm``): what every speedup of the row is against."""
    variants = row.get("variants") or {}
    times = [best_us(row.get("bsp"))]
    times += [best_us(variants.get(n)) for n in row.get("bsp_forms", ()) if n != "bsp"]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def row_op(row: Mapping[str, Any]) -> str:
    """The op of a result row (rows of the first files name none: the default op)."""
    from ..ops import DEFAULT_OP

    return row.get("op") or DEFAULT_OP


def case_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A result row's shape and layout fields, in the op's order (a row of a file written before rows
    named each op's own layout field: its :data:`LEGACY_DIM` read as the op's first keyword layout)."""
    op = op_named(row_op(row))
    out = {f: row[f] for f in (*op.shape_fields, *op.layout_choices) if f in row}
    dims = [f for f in op.call_layout() if f not in out]
    if dims and LEGACY_DIM in row:
        out[dims[0]] = row[LEGACY_DIM]
    return out


def problem_text(row: Mapping[str, Any], compact: bool = False, op: bool = True) -> str:
    """A row's problem in one short cell, dtype aside: ``ag_gemm M=64 N=256 K=256 gd=0 nk``; ``compact``:
    ``64x256x256 gd=0 nk``; ``op=False``: without the op's name."""
    from .._problem import IMPLICIT_LAYOUT, SHORT_LAYOUT

    fields = case_fields(row)
    shape = [f for f in op_named(row_op(row)).shape_fields if f in fields]
    words = ["x".join(str(fields[f]) for f in shape)] if compact else [f"{f}={fields[f]}" for f in shape]
    for f, v in fields.items():
        if f in shape or IMPLICIT_LAYOUT.get(f) == v:
            continue
        words.append(v if isinstance(v, str) else f"{SHORT_LAYOUT.get(f, f)}={v}")
    return " ".join([row_op(row), *words] if op else words)


def part_names(row: Mapping[str, Any]) -> list[str]:
    """The entries of a row that time the pieces of BSP alone, communication first (``parts``; rows of
    older files: their ``allgather``/``reduce_scatter`` and ``gemm`` entries)."""
    if "parts" in row:
        return list(row["parts"])
    return [n for n in ("allgather", "reduce_scatter", "gemm") if n in row]


def row_entries(row: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Everything compared against BSP in a row: variants, then dispatch and the peers."""
    out: dict[str, Mapping[str, Any]] = dict(row.get("variants") or {})
    skip = {"bsp", "variants", *part_names(row)}
    if "dispatch" in row:
        out["dispatch"] = row["dispatch"]
    for name, entry in row.items():
        if isinstance(entry, Mapping) and name not in skip and name not in out:
            out[name] = entry
    return out


def comm_entry(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's communication alone (its first part: the all-gather, the reduce-scatter, ...)."""
    names = part_names(row)
    return row.get(names[0]) if names else None


def compute_entry(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row's local compute alone (its last part, e.g. the GEMM)."""
    names = part_names(row)
    return row.get(names[-1]) if len(names) > 1 else None


def ceiling_us(row: Mapping[str, Any]) -> float | None:
    """The best possible fused time: the slowest part alone (e.g. max(communication, GEMM)), each at its
    faster mode."""
    times = [best_us(row.get(n)) for n in part_names(row)]
    return max(times) if times and None not in times else None


def _fmt(us: float | None) -> str:
    return "-" if us is None or not math.isfinite(us) else f"{us / 1e3:.3f}"


def row_line(row: Mapping[str, Any]) -> str:
    """One printable line: the problem, BSP eager/graph, communication and compute alone, each entry with
    its speedup."""
    head = problem_text(row)
    if "error" in row:
        return f"{head} | {row['error']}"
    bsp = bsp_us(row)
    parts = [
        head,
        f"{_fmt(row['bsp'].get('eager'))}/{_fmt(row['bsp'].get('graph'))}",
        _fmt(best_us(comm_entry(row))),
        _fmt(best_us(compute_entry(row))),
    ]
    ceiling = ceiling_us(row)
    parts.append(f"ceiling {SPEEDUP}{bsp / ceiling:.2f}" if bsp and ceiling else "ceiling -")
    for name, entry in row_entries(row).items():
        t = best_us(entry)
        if "skipped" in entry:
            continue
        if t is None:
            parts.append(f"{name}: {untimed_label(entry)}")
        else:
            times = f"{_fmt(entry.get('eager'))}/{_fmt(entry.get('graph'))}"
            parts.append(f"{name}: {times} {SPEEDUP}{bsp / t:.2f}" if bsp else f"{name}: {times}")
    return " | ".join(parts)


def fastest_entry(row: Mapping[str, Any]) -> tuple[str, float] | None:
    """``(name, µs)`` of the row's fastest timed form: BSP, a variant or a peer (dispatch aside, which
    serves one of them), or None. BSP counts, so the fastest is never slower than BSP."""
    entries = [("bsp", row.get("bsp")), *row_entries(row).items()]
    timed = [(t, n) for n, e in entries if n != "dispatch" and (t := best_us(e)) is not None]
    return (min(timed)[1], min(timed)[0]) if timed else None


def served_text(row: Mapping[str, Any]) -> str:
    """What dispatch served in ``row`` (``bsp``, ``cpu_chunked``, ...), "" where unknown."""
    entry = row.get("dispatch")
    return str(entry.get("variant", "")) if isinstance(entry, Mapping) else ""


def progress_line(row: Mapping[str, Any]) -> str:
    """A finished row in a short line: ``BSP 0.472 ms | fastest push ×1.20 | dispatch (push) ×1.18 |
    ceiling ×1.35`` (the row's error instead, when it has one). Every time in it comes from the same
    interleaved run."""
    if "error" in row:
        return f"error: {row['error']}"
    bsp = bsp_us(row)
    parts = [f"BSP {_fmt(bsp)} ms"]
    fastest = fastest_entry(row)
    if fastest is not None and bsp:
        parts.append(f"fastest {fastest[0]} {SPEEDUP}{bsp / fastest[1]:.2f}")
    dispatch = best_us(row.get("dispatch"))
    if dispatch is not None and bsp:
        parts.append(f"dispatch ({served_text(row)}) {SPEEDUP}{bsp / dispatch:.2f}")
    ceiling = ceiling_us(row)
    if ceiling is not None and bsp:
        parts.append(f"ceiling {SPEEDUP}{bsp / ceiling:.2f}")
    return " | ".join(parts)


def untimed_label(entry: Mapping[str, Any]) -> str:
    """What a variant's cell says when it has no time: ``n/a`` where no configuration of it is valid at the
    shape (a copy-engine variant at one rank, say), ``FAIL`` where every one it tried failed."""
    return "n/a" if entry.get("valid_configs") == 0 else "FAIL"


TABLE_LEGEND = (
    "ms per call; BSP eager/graph; communication and compute alone at their faster mode; ceiling = BSP /\n"
    "the slower of them; entries eager/graph and ×speedup = the fastest BSP form (bsp and e.g. bsp_symm,\n"
    "each at its faster mode) / entry's faster mode; a row's entries are timed interleaved in one run\n"
    "problem | BSP e/g | comm | compute | ceiling | ..."
)
