"""A model of each all-gather + GEMM design's time from bytes moved, B re-reads and first-tile latency,
checked against committed multi-GPU benchmarks, then used to rank the many-peer designs at 8 GPUs.

Per benchmark row the model takes what was measured alone (the GEMM ``G`` and NCCL's all-gather
``AG``, faster of eager and graph) and the hardware constants below, and predicts each variant at the
configuration the row ran (its ``best_params``):

* **push / pull / push_tma** (SMs move data inside the GEMM kernel): ``c`` producer CTAs (``comm_sms``,
  or the whole grid when 0) push ``(W-1)`` shards at ``min(link, c x CTA_BW)``; the GEMM core runs at
  ``CORE`` of cuBLAS (one-rank measurements), reads B ``passes = row tiles / effective GROUP_M`` times
  (GROUP_M collapses to the tile rows of one shard unless ``group_across``), and loses the producers'
  SMs while they copy; the first peer tile waits for one chunk's copy to every peer (``release_each``:
  to one), and the peers' tiles that can only start after the whole push (one tile row per shard at
  gather_dim=0, chunks in an order the tiles cannot use) form a tail after it.
* **copy_engine / ce_fanout / ce_grouped** (copy engine, vendor GEMMs): copies of at least ``CE_FLOOR``
  each, serial per stream, sharing the link; the main stream runs the local GEMM, then each GEMM when
  its peers' data is in; each GEMM reads all of B (gather_dim=0) or read-modify-writes all of ``out``
  (gather_dim=1), plus a launch.
* **BSP**: ``AG + G``.

``python bench/cost_model.py --out bench/results/DIR/cost_model.json`` writes every prediction beside
its measurement and prints the error per variant and world size, then the predicted ranking of the
designs for the 8-GPU shapes. A model, not a measurement: it says which designs are worth the 8-GPU run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

HBM_BW = 2.6e12  # B/s a GEMM streams B at (the rows' own GEMM alone at M=256 reads 128 MiB in 52 us)
LINK_BW = 370e9  # B/s one GPU sends over NVLink to all peers together (H200, NVLink 4, practical)
CTA_BW = 25e9  # B/s one CTA pushes with loads and remote stores
CE_BW = 336e9  # B/s one copy-engine copy (bench: 32 MiB in 99.7 us)
CE_FLOOR = 16e-6  # s, the least a copy-engine copy takes (0.125 MiB: 16.7 us)
LAUNCH = 4e-6  # s per extra kernel launch on a stream
FLAG = 2e-6  # s from a flag's release to its waiter's start
NUM_SMS = 132
#: The fused kernels' GEMM core against cuBLAS at one rank (bench/gemm_vs_cublas.py --fused --tma).
CORE = {"push": 0.955, "pull": 0.955, "push_tma": 0.965}

#: The committed benchmarks the model is checked against (world size -> file): N=K=8192, H200.
SOURCES = {
    2: "bench/results/2026-11-22_lean_h200x2/bench_8192x8192.json",
    4: "bench/results/2026-11-22_push_tma/bench_ws4_8192.json",
    8: "bench/results/2026-11-22_ws8_h200x8/bench_ws8.json",
}


def _best(entry: dict) -> float:
    return min(v for v in (entry.get("eager"), entry.get("graph")) if v) * 1e-6


def shard_bytes(m: int, k: int, ws: int, gd: int) -> int:
    return (m // ws) * k * 2 if gd == 0 else m * (k // ws) * 2


def b_passes(m: int, n: int, ws: int, gd: int, p: dict) -> int:
    """How many times the GEMM streams B from HBM: once per group of GROUP_M row tiles (GROUP_M capped
    by one shard's tile rows unless ``group_across``), or per the rows the resident programs cover at
    once, whichever is more (their B reads meet in L2)."""
    bm = p.get("block_m", 128)
    rows = math.ceil(m / bm)
    shard_rows = max(1, (m // ws) // bm) if gd == 0 else rows
    group = min(p.get("group_m", 8), rows if p.get("group_across") else shard_rows)
    resident = min(rows, max(1, NUM_SMS // math.ceil(n / p.get("block_n", 128))))
    return math.ceil(rows / max(group, resident, 1))


def fused(name: str, m: int, n: int, k: int, ws: int, gd: int, g: float, p: dict, link: float) -> dict:
    """The in-kernel designs (push, pull, push_tma): the model's terms and its total."""
    sent = (ws - 1) * shard_bytes(m, k, ws, gd)
    producers = p.get("comm_sms", 8) or NUM_SMS
    comm = sent / min(link, producers * CTA_BW) * (2 if name == "pull" else 1)  # pull: stage, then fetch
    core = g / CORE.get(name, 1.0)
    b_time = b_passes(m, n, ws, gd, p) * k * n * 2 / HBM_BW
    if gd == 1:  # the K loop restarts its pipeline at every peer's slice
        core *= 1 + (p.get("num_stages", 3) - 1) * p.get("block_k", 64) * ws / k
    gemm = max(core, b_time)
    if p.get("comm_sms", 8):
        gemm += producers / NUM_SMS * min(comm, gemm)  # the producers' SMs, while they copy
    chunks = p.get("row_chunks", 4) * p.get("k_chunks", 1)
    chunk = shard_bytes(m, k, ws, gd) / chunks
    first = chunk / CTA_BW * (1 if p.get("release_each") else ws - 1) + FLAG
    if gd == 0:  # a peer's tile row is whole only when its last chunk lands
        tail_share = min(1.0, p.get("block_m", 128) / max(m // ws, 1))
        if p.get("push_order") or p.get("release_each"):
            tail_share = tail_share / ws
    else:  # every tile needs every peer's K slice of its rows
        tail_share = 1.0 / p.get("row_chunks", 4)
    tail = gemm * (ws - 1) / ws * tail_share
    total = max(gemm + first, comm + tail) + LAUNCH
    return {"comm": comm, "gemm": gemm, "b_time": b_time, "first": first, "tail": tail, "total": total}


def _gemm_time(rows: int, peers: int, m: int, n: int, k: int, ws: int, gd: int, g: float) -> float:
    """One vendor GEMM over ``peers`` shards of ``rows`` rows each: at gather_dim=0 their rows (its share
    of G, at least one read of B); at gather_dim=1 their K slices (its share of G plus one
    read-modify-write of ``out``, at least one read of their B slices); plus a launch."""
    if gd == 0:
        return max(g * rows * peers / m, k * n * 2 / HBM_BW) + LAUNCH
    share = g * peers / ws + m * n * 4 / HBM_BW
    return max(share, peers * (k // ws) * n * 2 / HBM_BW) + LAUNCH


def copy_engine(name: str, m: int, n: int, k: int, ws: int, gd: int, g: float, p: dict, link: float) -> dict:
    """The copy-engine designs: arrival of each peer's data, then the GEMM schedule on the main stream."""
    shard = shard_bytes(m, k, ws, gd)
    rows = m // ws if gd == 0 else m
    streams = 1 if name == "copy_engine" else min(p.get("streams", 1), ws - 1)
    chunks = p.get("chunks", 1)
    per_copy = max(CE_FLOOR, shard / chunks / min(CE_BW, link / streams))
    peers = list(range(1, ws))  # in arrival (rotated) order, dealt round robin to the lanes
    arrive = {}
    for i, peer in enumerate(peers):
        arrive[peer] = (i // streams + 1) * chunks * per_copy
    if name == "copy_engine" and p.get("gather_first"):
        total = max(arrive.values()) + g + LAUNCH
        return {"comm": max(arrive.values()), "total": total}
    if name == "copy_engine" or (name == "ce_fanout" and (p.get("gemms") == "peer" or gd == 1)):
        groups = [[q] for q in peers]
    elif name == "ce_fanout":  # one GEMM per run: at rank 0 all peers form one run
        groups = [peers]
    else:
        size = p.get("group", 2)
        groups = [peers[i : i + size] for i in range(0, len(peers), size)]
    t = _gemm_time(rows, 1, m, n, k, ws, gd, g)  # the local shard first
    for grp in groups:
        t = max(t, max(arrive[q] for q in grp) + FLAG)
        t += _gemm_time(rows, len(grp), m, n, k, ws, gd, g)
    return {"comm": max(arrive.values()), "total": t}


def predict(name: str, row: dict, ws: int, p: dict) -> dict:
    m, n, k, gd = row["M"], row["N"], row["K"], row["gather_dim"]
    g = _best(row["gemm"])
    # the link as NCCL's all-gather of this row used it (never above the practical NVLink rate)
    link = min(LINK_BW, (ws - 1) * shard_bytes(m, k, ws, gd) / _best(row["allgather"]))
    if name in ("push", "pull", "push_tma"):
        return fused(name, m, n, k, ws, gd, g, p, link)
    return copy_engine(name, m, n, k, ws, gd, g, p, link)


def check(min_m: int) -> tuple[list[dict], dict]:
    """Predictions against every committed measurement at M >= ``min_m``."""
    out, errors = [], {}
    for ws, path in SOURCES.items():
        for row in json.loads(Path(path).read_text())["rows"]:
            if row["M"] < min_m:
                continue
            bsp = _best(row["bsp"])
            for name, entry in [("bsp", None), *row["variants"].items()]:
                if entry is None:
                    pred, measured = _best(row["allgather"]) + _best(row["gemm"]), bsp
                    terms: dict = {}
                else:
                    if not entry.get("best_params") or not (entry.get("eager") or entry.get("graph")):
                        continue
                    terms = predict(name, row, ws, entry["best_params"])
                    pred, measured = terms["total"], _best(entry)
                err = pred / measured - 1
                errors.setdefault((name, ws), []).append(err)
                out.append({
                    "world_size": ws, "M": row["M"], "N": row["N"], "K": row["K"],
                    "gather_dim": row["gather_dim"], "variant": name, "measured_us": measured * 1e6,
                    "predicted_us": pred * 1e6, "error": err,
                    "terms_us": {t: v * 1e6 for t, v in terms.items()},
                    "params": entry.get("best_params") if entry else None,
                })  # fmt: skip
    return out, errors


#: The designs ranked for the 8-GPU run: the shipped push schedule, the many-peer schedule, copy_engine
#: and the two copy-engine schedules for many peers.
_MANY = {"push_order": 1, "release_each": 1, "group_across": 1}
DESIGNS = {
    "push (shipped schedule)": ("push", {"comm_sms": 16, "row_chunks": 64, "k_chunks": 1, "group_m": 8}),
    "push, every program producing": ("push", {"comm_sms": 0, "row_chunks": 16, "k_chunks": 8, "group_m": 8}),
    "push, many-peer schedule": ("push", {"comm_sms": 32, "row_chunks": 16, "group_m": 8, **_MANY}),
    "push_tma, many-peer schedule": ("push_tma", {"comm_sms": 32, "row_chunks": 16, "group_m": 8, **_MANY}),
    "copy_engine (one stream)": ("copy_engine", {"chunks": 1}),
    "ce_fanout (7 streams, range)": ("ce_fanout", {"streams": 8, "gemms": "range", "chunks": 1}),
    "ce_grouped (7 streams, group 2)": ("ce_grouped", {"streams": 8, "group": 2}),
    "ce_grouped (7 streams, group 4)": ("ce_grouped", {"streams": 8, "group": 4}),
}  # fmt: skip


def rank_designs() -> list[dict]:
    """Each design's predicted time on the 8-GPU rows, against BSP and the ceiling."""
    out = []
    for row in json.loads(Path(SOURCES[8]).read_text())["rows"]:
        bsp, ceiling = _best(row["bsp"]), max(_best(row["allgather"]), _best(row["gemm"]))
        for label, (name, params) in DESIGNS.items():
            t = predict(name, row, 8, params)["total"]
            out.append({"M": row["M"], "gather_dim": row["gather_dim"], "design": label,
                        "predicted_us": t * 1e6, "x_bsp": bsp / t, "x_ceiling": t / ceiling})  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--min-m", type=int, default=256)
    args = parser.parse_args()
    rows, errors = check(args.min_m)
    designs = rank_designs()
    summary = {
        f"{name} ws{ws}": {"rows": len(e), "median_abs_error": statistics.median(abs(x) for x in e),
                           "max_abs_error": max(abs(x) for x in e)}
        for (name, ws), e in sorted(errors.items())
    }  # fmt: skip
    names = ("HBM_BW", "LINK_BW", "CTA_BW", "CE_BW", "CE_FLOOR", "LAUNCH", "FLAG")
    constants = {k: globals()[k] for k in names}
    Path(args.out).write_text(json.dumps(
        {"sources": SOURCES, "constants": constants, "core": CORE, "min_m": args.min_m, "errors": summary,
         "rows": rows, "designs_ws8": designs}, indent=1,
    ))  # fmt: skip
    print("variant, world size: rows, median |error|, max |error| (prediction against the measurement)")
    for key, s in summary.items():
        print(f"  {key:22s} {s['rows']:3d}  {s['median_abs_error']:6.1%}  {s['max_abs_error']:6.1%}")
    print("\n8 GPUs, N=K=8192: predicted µs (x over BSP, x the ceiling)")
    by_shape: dict = {}
    for d in designs:
        by_shape.setdefault((d["gather_dim"], d["M"]), []).append(d)
    for (gd, m), ds in sorted(by_shape.items()):
        print(f"  gd{gd} M={m}")
        for d in sorted(ds, key=lambda d: d["predicted_us"]):
            ratios = f"({d['x_bsp']:.2f}x BSP, {d['x_ceiling']:.2f}x ceiling)"
            print(f"    {d['design']:34s} {d['predicted_us']:7.1f}  {ratios}")


if __name__ == "__main__":
    main()
