"""Copy-engine all-gather + two vendor GEMMs: the local shard's, then one over every peer's rows.

Issue 47: at four and eight ranks and small M the copy-engine schedules' GEMMs cost more than the product
they make. Each GEMM has its own partial last wave, and one per peer is a quarter (an eighth) of M. On one
H200 with cuBLAS alone (``bench/results/2026-11-29_gemm_split_h200/``, TP4 layer keys at M=1024), four
GEMMs per peer took 2.9-3.7x the whole product and one per peer 1.05-1.84x. ``ce_fanout``'s ``range`` on a
middle rank (the local GEMM, then its peers' rows in two runs, ``r+1 .. W-1`` and ``0 .. r-1``) took 86
and 389 µs (N=2560, 14336), the first and last ranks' local GEMM and one run 70 and 356. The slowest rank
sets the call's time. Here on rank ``r``:

* the lanes are ``ce_fanout``'s (the peers dealt to ``streams`` side streams, one copy per peer, each
  behind the peer's ``done`` token and followed by its flag), but rank ``r`` writes its shard into peer
  ``p``'s inbox at slot ``(r - p - 1) mod W``: every inbox then holds its peers in the order of
  ``peer_order(p, W, "rotated")`` (``p+1, p+2, ..., p-1``), one after another;
* the caller's stream: the local shard's GEMM into its rows of ``out``, then, once every peer's flag is
  up, **one** GEMM of the ``(W-1)·M/W`` inbox rows. On the first rank (peers ``1 .. W-1``) and the last
  (``0 .. W-2``) those are one run of ``out``, written in place; on the others the GEMM writes a scratch
  (``RestPlan.scratch``) whose two parts are copied into ``out``'s two runs (``r+1 .. W-1`` first, then
  ``0 .. r-1``) on the caller's stream by ``cuMemcpyAsync`` (a same-device copy, which the driver runs
  as a copy kernel on the SMs, not on the copy engine: ``bench/copy_sm_probe.py``; here no kernel spins
  beside it): one more pass over ``(W-1)/W`` of ``out``
  instead of a second GEMM's last wave. Measured there: 74 and 377 µs against the two runs' 86 and
  389 (the scratch's path a quarter to two thirds of what one GEMM saves), and more than the two runs
  from M=2048;
* then it tells every peer that its inbox has been consumed and joins the lanes.

``gather_dim=0`` only (at ``gather_dim=1`` the peers' K-slices would need ``B``'s rows in the same
rotated order). Flags, ``done`` tokens and the epoch are :mod:`..copy_engine`'s channel; only the inbox
slots differ, and a call of another schedule on the channel comes after this call's ``done`` tokens,
when the whole inbox is free. Nothing the host passes changes from call to call: CUDA-graph safe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ...common.channel import fork_lanes, join_lanes
from ...common.lanes import peer_lanes
from .. import copy_engine as ce
from .ce_fanout import _send_lane as _send  # the plan's rotated slots, one chunk a peer
from .ce_fanout import peer_runs


@dataclass(frozen=True)
class RestPlan:
    """A copy-engine plan whose ``remote_inbox`` addresses the rotated slots, its lanes, and the scratch
    of the peers' GEMM (``((W-1)·M/W, N)``; None on the first and last rank, which write ``out``)."""

    base: ce.Plan
    lanes: tuple[tuple[int, ...], ...]  # peers per side stream, in issue order
    scratch: Any


def rotated_slot(sender: int, receiver: int, world_size: int) -> int:
    """The inbox slot of ``receiver`` that ``sender``'s shard lands in: ``receiver``'s peers in the
    order it takes them (``receiver+1`` in slot 0, ``receiver-1`` in the last)."""
    return (sender - receiver - 1) % world_size


def out_runs(rank: int, world_size: int, rows: int) -> tuple[tuple[int, int], ...]:
    """``(first row of out, rows)`` of each run the peers' GEMM fills, in the scratch's order:
    ``ce_fanout``'s runs of peers (those above ``rank``, then those below), in rows."""
    return tuple((lo * rows, (hi - lo + 1) * rows) for lo, hi in peer_runs(rank, world_size))


def make_rest_plan(channel: ce.Channel, *, m: int, n: int, k: int, elem: int, dtype: Any,
                   streams: int) -> RestPlan:  # fmt: skip
    """Resolve a call's addresses, lanes and scratch (collective: may grow the channel's arena)."""
    r, ws = channel.rank, channel.world_size
    base = ce.make_plan(
        channel, m=m, k=k, gather_dim=0, elem=elem, chunks=1, order="rotated", gather_first=False,
        fp32_accumulate=False,
    )  # fmt: skip
    slot = base.inbox_ptr  # the arena: at the same offset on every rank
    remote_inbox = tuple(
        (p, channel.remote(slot + rotated_slot(r, p, ws) * base.shard_bytes, p)) for p in base.peers
    )
    base = dataclasses.replace(base, remote_inbox=remote_inbox)
    scratch = None
    if len(out_runs(r, ws, base.rows)) > 1:
        scratch = torch.empty(((ws - 1) * base.rows, n), dtype=dtype, device=channel.data.device)
    return RestPlan(base=base, lanes=peer_lanes(base.peers, streams), scratch=scratch)


def ag_gemm_ce_local_rest(channel: ce.Channel, plan: RestPlan, inbox: Any, a_shard: Any, b: Any, out: Any,
                          acc: Any = None, watch: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` (``gather_dim=0``) with two GEMMs; collective.

    ``inbox`` is the channel's arena viewed as ``a_shard``'s dtype; ``acc`` unused (the copy-engine
    launchers' signature); ``watch`` the watch slot bounding the flag waits (as in
    ``copy_engine.ag_gemm_ce``). Launches only: no host synchronisation, no allocation.
    """
    ch, r, base = channel, channel.rank, plan.base
    main, lanes = fork_lanes(ch, plan.lanes, watch, _send, ch, plan, a_shard)
    rows, ks = base.rows, base.k_shard
    torch.matmul(a_shard, b, out=out[r * rows : (r + 1) * rows])
    flags = ch.data.view(ch.world_size, ce.MAX_CHUNKS)
    for p in base.peers:
        ce._await(ch, flags[p, 0:1], main)
    peers_a = inbox[: len(base.peers) * rows * ks].view(-1, ks)
    runs = out_runs(r, ch.world_size, rows)
    if plan.scratch is None:
        first, count = runs[0]
        torch.matmul(peers_a, b, out=out[first : first + count])
    else:
        torch.matmul(peers_a, b, out=plan.scratch)
        at = 0
        for first, count in runs:
            out[first : first + count].copy_(plan.scratch[at : at + count])
            at += count
    join_lanes(ch, base.remote_done, main, lanes)  # this rank consumed its inbox: peers may overwrite it
    return out
