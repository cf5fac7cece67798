"""A whole benchmark run: every case on ``world_size`` spawned ranks, then the peers that need a process
group of their own, and the JSON report (written atomically, again after each stage)."""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .case import BenchConfig, Case
from .form import bench_form, op_named
from .rank import apart, bench_rank, peer_rank
from .tuned import Tuned

UNITS = (
    "microseconds per call, median, max over ranks; eager = calls in a row, graph = CUDA graph; "
    "config.chain = dependent: each call waits for the previous one's output (link cost subtracted)"
)


def peer_groups(cfg: BenchConfig, rows: list[Mapping[str, Any]]) -> list[tuple[str, tuple[Case, ...]]]:
    """``(peer, cases)`` of every process group of its own that the peers of ``rows`` need (a peer's
    cases split by its ``group_by``), in case order."""
    groups: dict[tuple[str, Any], list[Case]] = {}
    for case, row in zip(cfg.cases, rows, strict=True):
        if "error" in row:
            continue
        key = case.key("any", cfg.world_size)
        for name, peer in bench_form(op_named(case.op)).peers.items():
            measured = [*row.get("bsp_forms", ()), *(row.get("variants") or ())]
            if peer.applies(key) and apart(peer, measured) and cfg.device in peer.device_types:
                groups.setdefault((name, peer.group_by(key)), []).append(case)
    return [(name, tuple(cases)) for (name, _), cases in groups.items()]


def _peer_group(name: str, cfg: BenchConfig, cases: tuple[Case, ...]) -> dict[Case, Any]:
    """The peer ``name`` on ``cfg.world_size`` fresh GPU ranks: its per-case entries. A group that hangs
    marks every case as timed out; one that raises is retried case by case, so one failing M does not
    hide the others."""
    from .._launch import RanksFailed, run_ranks

    if not cases:
        return {}
    timeout = cfg.peer_timeout
    try:
        rows = run_ranks(peer_rank, cfg.world_size, cfg.device, args=(cfg, name, cases), timeout=timeout)
        return dict(zip(cases, rows[0], strict=True))
    except RanksFailed as exc:
        if "did not finish" in str(exc):
            return {c: {"error": f"timed out after {cfg.peer_timeout:.0f} s (hang?)"} for c in cases}
    result = {}
    for case in cases:
        try:
            args = (cfg, name, (case,))
            rows = run_ranks(peer_rank, cfg.world_size, cfg.device, args=args, timeout=timeout)
            result[case] = rows[0][0]
        except RanksFailed as exc:
            result[case] = {"error": str(exc)[-400:]}
    return result


def environment(device: str) -> dict[str, Any]:
    """Device name, GPU count and software versions, stored with every result file."""
    import torch

    from .._target import software_versions

    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "versions": software_versions(),
    }


def write_json(report: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``report`` atomically (a temporary file renamed over ``path``): never half-written."""
    from ..output_file import write_atomic

    write_atomic(path, json.dumps(report, indent=1, default=str, allow_nan=True), make_folder=True)


def run_bench(
    cfg: BenchConfig,
    tuned: Tuned | None = None,
    out_path: str | os.PathLike[str] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Run every case of ``cfg`` on ``cfg.world_size`` spawned ranks; return (and write) the report.

    With ``out_path`` the JSON is written after the main run, and again after Iris' stock kernel (which
    may hang), so a hang loses nothing measured before it.
    """
    from .._launch import run_ranks

    cfg.validate()
    if cfg.progress_path is not None:  # a fresh progress log; rank 0 appends to it
        os.makedirs(os.path.dirname(os.path.abspath(cfg.progress_path)), exist_ok=True)
        open(cfg.progress_path, "w").close()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timeout = 120 + (90 if cfg.device == "cuda" else 30) * len(cfg.cases)
    rows = run_ranks(bench_rank, cfg.world_size, cfg.device, args=(cfg, dict(tuned or {})), timeout=timeout)[
        0
    ]
    report = {
        **environment(cfg.device),
        "world_size": cfg.world_size,
        "date": started,
        "command": command
        if command is not None
        else " ".join([os.path.basename(sys.executable), *sys.argv]),
        "config": {**asdict(cfg), "cases": [c.row() for c in cfg.cases]},
        "units": UNITS,
        "rows": rows,
    }
    if out_path is not None:
        write_json(report, out_path)
    if cfg.peers:
        for name, cases in peer_groups(cfg, rows):
            for case, entry in _peer_group(name, cfg, cases).items():
                rows[cfg.cases.index(case)][name] = entry
        if out_path is not None:
            write_json(report, out_path)
    return report
