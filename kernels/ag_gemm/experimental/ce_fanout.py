"""Copy-engine all-gather + GEMM for three or more ranks: peer copies fanned out over several side
streams, the peers' rows multiplied in as few GEMMs as their layout allows.

:mod:`..copy_engine` issues every peer copy on one side stream, one after another, and runs one vendor GEMM
per peer (and chunk). With ``W - 1`` peers both costs grow: each copy-engine copy has a floor of about
16 µs however small (``bench/ce_copy_probe.py``), and each GEMM of ``M / W`` rows reads all of ``B``
again (on 8×H200, N=K=8192, ``copy_engine`` ran 1.1–2.2× slower than BSP at M ≥ 1024). Here, on rank
``r``:

* the peers are dealt round robin to ``streams`` side streams (*lanes*, lane 0 is the channel's own side
  stream); each lane, forked from the caller's stream, waits for each of its peers to have consumed the
  previous call's data, copies ``A_r`` (chunk by chunk) into that peer's inbox and raises its flag, so
  copies to different peers run on different copy engines at once;
* the caller's stream runs the local shard's GEMM, then (``gather_dim=0``, ``gemms="range"``) waits for
  every peer of one contiguous run of ranks (``r+1 .. W-1``, then ``0 .. r-1``) and multiplies the whole
  run in one GEMM: inbox slots are in rank order, as are the output's rows, so a run is one matrix.
  ``gemms="peer"`` (and every ``gather_dim=1`` call, whose peers' K-slices do not form one matrix in the
  inbox) keeps one GEMM per peer and chunk, as :mod:`..copy_engine` does;
* then it tells every peer that its inbox has been consumed and joins every lane.

Flags, tokens, inboxes and the epoch are :mod:`..copy_engine`'s channel: the same protocol, so calls of the
two schedules may follow one another on one channel. CUDA-graph safe for the same reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...common import signal as sig
from ...common.channel import fork_lanes, join_lanes
from ...common.lanes import peer_lanes
from .. import copy_engine as ce

GEMMS = ("range", "peer")


@dataclass(frozen=True)
class FanoutPlan:
    """A copy-engine plan plus how its peers are spread over lanes and grouped into GEMMs."""

    base: ce.Plan
    lanes: tuple[tuple[int, ...], ...]  # peers per side stream, in issue order
    runs: tuple[tuple[int, int], ...]  # gather_dim=0 "range": (first, last) rank of each GEMM's peers


def peer_runs(rank: int, world_size: int) -> tuple[tuple[int, int], ...]:
    """The contiguous runs of ranks other than ``rank``, in the order their data arrives (rank-rotated:
    ``rank+1 .. W-1`` first, then ``0 .. rank-1``); empty runs left out."""
    runs = []
    if rank + 1 <= world_size - 1:
        runs.append((rank + 1, world_size - 1))
    if rank >= 1:
        runs.append((0, rank - 1))
    return tuple(runs)


def make_fanout_plan(
    channel: ce.Channel,
    *,
    m: int,
    k: int,
    gather_dim: int,
    elem: int,
    chunks: int,
    streams: int,
    gemms: str,
    fp32_accumulate: bool,
) -> FanoutPlan:
    """Resolve a call's addresses, lanes and GEMM runs (collective: may grow the channel's arena)."""
    if gemms not in GEMMS:
        raise ValueError(f"gemms: expected one of {', '.join(GEMMS)}, got {gemms!r}")
    if gemms == "range" and gather_dim != 0:
        raise ValueError("gemms='range' needs gather_dim=0 (gather_dim=1 peers' K-slices are not one matrix)")
    base = ce.make_plan(
        channel, m=m, k=k, gather_dim=gather_dim, elem=elem, chunks=chunks, order="rotated",
        gather_first=False, fp32_accumulate=fp32_accumulate,
    )  # fmt: skip
    runs = peer_runs(channel.rank, channel.world_size) if gemms == "range" else ()
    return FanoutPlan(base=base, lanes=peer_lanes(base.peers, streams), runs=runs)


def _send_lane(ch: ce.Channel, plan: FanoutPlan, a_shard: Any, peers: tuple[int, ...], stream: Any) -> None:
    """On ``stream`` (the current stream): copy this rank's shard into each of ``peers``' inboxes, chunk
    by chunk, each chunk's flag raised behind its copy."""
    base = plan.base
    inbox_of, data_of = dict(base.remote_inbox), dict(base.remote_data)
    row_bytes = base.k_shard * base.elem
    src = a_shard.data_ptr()
    for p in peers:
        ce._await(ch, ch.done[p : p + 1], stream, offset=-1)  # p has read the previous call's data
        for c, (first, n) in enumerate(base.chunk_rows):
            off = first * row_bytes
            sig.memcpy_async(inbox_of[p] + off, src + off, n * row_bytes, stream)
            ce._raise(ch, data_of[p] + 4 * c, stream)


def gemm_peer_runs(ch: ce.Channel, base: ce.Plan, runs: tuple[tuple[int, int], ...], inbox: Any, b: Any,
                   out: Any, flags: Any, main: Any) -> None:  # fmt: skip
    """``gather_dim=0``: one GEMM per run ``(lo, hi)`` of consecutive peers, once every chunk of theirs has
    landed (inbox slots are in rank order, as are the output's rows, so a run is one matrix)."""
    rows, ks = base.rows, base.k_shard
    n = rows * ks
    for lo, hi in runs:
        for p in range(lo, hi + 1):
            for c in range(len(base.chunk_rows)):
                ce._await(ch, flags[p, c : c + 1], main)
        run_a = inbox[lo * n : (hi + 1) * n].view(-1, ks)
        torch.matmul(run_a, b, out=out[lo * rows : (hi + 1) * rows])


def ag_gemm_ce_fanout(channel: ce.Channel, plan: FanoutPlan, inbox: Any, a_shard: Any, b: Any, out: Any,
                      acc: Any = None, watch: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` with the fanned-out schedule; collective.

    ``inbox`` is the channel's arena viewed as ``a_shard``'s dtype; ``acc`` an fp32 ``out``-shaped
    workspace when ``plan.base.fp32_accumulate``; ``watch`` the watch slot bounding the flag waits (as in
    ``copy_engine.ag_gemm_ce``). Launches only: no host synchronisation, no allocation.
    """
    ch, r, base = channel, channel.rank, plan.base
    main, lanes = fork_lanes(ch, plan.lanes, watch, _send_lane, ch, plan, a_shard)
    rows = base.rows
    flags = ch.data.view(ch.world_size, ce.MAX_CHUNKS)
    if base.gather_dim == 0:
        torch.matmul(a_shard, b, out=out[r * rows : (r + 1) * rows])
        if plan.runs:
            gemm_peer_runs(ch, base, plan.runs, inbox, b, out, flags, main)
        else:
            ce.gemm_peer_rows(ch, base, inbox, b, out, flags, main)
    else:
        ce.gemm_k_slices(ch, base, inbox, a_shard, b, out, acc, flags, main)
    join_lanes(ch, base.remote_done, main, lanes)  # this rank consumed its inbox: peers may overwrite it
    return out
