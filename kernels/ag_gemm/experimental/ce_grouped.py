"""Copy-engine all-gather + GEMM for many peers, with the peers' GEMMs grouped: each GEMM multiplies a
run of ``group`` consecutive peers, so ``B`` is read once per ``group`` peers instead of once per peer,
while the first groups still start before the last peers' data lands.

Of the copy-engine family, :mod:`..copy_engine` runs one GEMM per peer and chunk after copies issued one
after another on one side stream; :mod:`.ce_fanout` spreads the copies over several streams and, at
``gather_dim=0``, waits for a whole run of ranks (up to ``W - 1`` peers) before one GEMM, and at
``gather_dim=1`` still runs one GEMM per peer, each a read-modify-write of all of ``out``. Here, on rank
``r``, with the peers dealt to ``streams`` lanes as in :mod:`.ce_fanout`:

* ``gather_dim=0``: the peers' shards land in the inbox in rank order, as the output's rows, so the
  shards of consecutive ranks are one matrix: the local shard's GEMM first, then one GEMM per group of at
  most ``group`` consecutive peers in arrival order (``r+1 ..``, wrapping past ``W - 1`` starts a new
  group);
* ``gather_dim=1``: each peer's ``(M, K/W)`` shard lands by a strided copy-engine copy
  (``cuMemcpy2DAsync``) as columns ``p K/W .. (p+1) K/W`` of one ``(M, K)`` buffer, so a group of
  consecutive peers is one column block: the local product first, then one ``addmm`` per group
  (``accumulate="fp32"``: into an fp32 workspace, converted at the end).

``group=1`` is one GEMM per peer; ``group >= W - 1`` one per contiguous run (:mod:`.ce_fanout`'s
``range``, here at both gather dims). One copy per peer (a copy-engine copy costs about 16 µs however
small). Flags, tokens, inboxes and the epoch are :mod:`..copy_engine`'s channel, so calls of every
copy-engine schedule may follow one another on one channel; CUDA-graph safe for the same reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...common import signal as sig
from ...common.channel import fork_lanes, join_lanes
from ...common.copy2d import memcpy2d_async
from ...common.lanes import peer_lanes
from .. import copy_engine as ce
from .ce_fanout import gemm_peer_runs, peer_runs


@dataclass(frozen=True)
class GroupedPlan:
    """A copy-engine plan (one chunk) plus lanes, GEMM groups and, at ``gather_dim=1``, where this
    rank's columns go in each peer's gathered buffer."""

    base: ce.Plan
    lanes: tuple[tuple[int, ...], ...]
    groups: tuple[tuple[int, int], ...]  # (first, last) rank of each GEMM's peers, in arrival order
    remote_cols: tuple[tuple[int, int], ...]  # gather_dim=1: (peer, address of this rank's column block)


def peer_groups(rank: int, world_size: int, group: int) -> tuple[tuple[int, int], ...]:
    """The peers of ``rank`` in arrival order (``rank+1 .. W-1``, then ``0 .. rank-1``), cut into runs of
    at most ``group`` consecutive ranks (a run never wraps past ``W - 1``)."""
    if group < 1:
        raise ValueError(f"group: {group} must be at least 1")
    out = []
    for lo, hi in peer_runs(rank, world_size):
        out.extend((s, min(s + group - 1, hi)) for s in range(lo, hi + 1, group))
    return tuple(out)


def make_grouped_plan(
    channel: ce.Channel, *, m: int, k: int, gather_dim: int, elem: int, streams: int, group: int,
    fp32_accumulate: bool,
) -> GroupedPlan:  # fmt: skip
    """Resolve a call's addresses, lanes and groups (collective: may grow the channel's arena)."""
    base = ce.make_plan(
        channel, m=m, k=k, gather_dim=gather_dim, elem=elem, chunks=1, order="rotated",
        gather_first=False, fp32_accumulate=fp32_accumulate,
    )  # fmt: skip
    cols = ()
    if gather_dim == 1:
        own = base.inbox_ptr + channel.rank * base.k_shard * elem
        cols = tuple((p, channel.remote(own, p)) for p in base.peers)
    groups = peer_groups(channel.rank, channel.world_size, group)
    return GroupedPlan(base=base, lanes=peer_lanes(base.peers, streams), groups=groups, remote_cols=cols)


def _send_lane(ch: ce.Channel, plan: GroupedPlan, a_shard: Any, peers: tuple[int, ...], stream: Any) -> None:
    """On ``stream``: this rank's shard into each of ``peers``' inboxes (``gather_dim=1``: as a column
    block of their gathered buffer), each flag raised behind its copy."""
    base = plan.base
    dst_of = dict(base.remote_inbox if base.gather_dim == 0 else plan.remote_cols)
    data_of = dict(base.remote_data)
    row_bytes = base.k_shard * base.elem
    for p in peers:
        ce._await(ch, ch.done[p : p + 1], stream, offset=-1)  # p has read the previous call's data
        if base.gather_dim == 0:
            sig.memcpy_async(dst_of[p], a_shard.data_ptr(), base.shard_bytes, stream)
        else:
            pitch = row_bytes * ch.world_size
            memcpy2d_async(dst_of[p], pitch, a_shard.data_ptr(), row_bytes, row_bytes, base.rows, stream)
        ce._raise(ch, data_of[p], stream)


def ag_gemm_ce_grouped(channel: ce.Channel, plan: GroupedPlan, inbox: Any, a_shard: Any, b: Any, out: Any,
                       acc: Any = None, watch: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` with the grouped schedule; collective. Arguments as
    :func:`.ce_fanout.ag_gemm_ce_fanout`'s; launches only."""
    ch, r, base = channel, channel.rank, plan.base
    main, lanes = fork_lanes(ch, plan.lanes, watch, _send_lane, ch, plan, a_shard)
    rows, ks, ws = base.rows, base.k_shard, ch.world_size
    flags = ch.data.view(ws, ce.MAX_CHUNKS)
    if base.gather_dim == 0:
        torch.matmul(a_shard, b, out=out[r * rows : (r + 1) * rows])
        gemm_peer_runs(ch, base, plan.groups, inbox, b, out, flags, main)  # one chunk per peer here
    else:
        gathered = inbox[: rows * ks * ws].view(rows, ks * ws)
        target = acc if base.fp32_accumulate else out
        if base.fp32_accumulate:
            torch.mm(a_shard, b[r * ks : (r + 1) * ks], out_dtype=torch.float32, out=target)
        else:
            torch.matmul(a_shard, b[r * ks : (r + 1) * ks], out=target)
        for lo, hi in plan.groups:
            for p in range(lo, hi + 1):
                ce._await(ch, flags[p, 0:1], main)
            a_g, b_g = gathered[:, lo * ks : (hi + 1) * ks], b[lo * ks : (hi + 1) * ks]
            if base.fp32_accumulate:
                torch.addmm(target, a_g, b_g, out_dtype=torch.float32, out=target)
            else:
                target.addmm_(a_g, b_g)
        if base.fp32_accumulate:
            out.copy_(acc)
    join_lanes(ch, base.remote_done, main, lanes)  # this rank consumed its inbox: peers may overwrite it
    return out
