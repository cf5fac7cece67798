"""Copy-engine all-gather + GEMM by pulls: each rank publishes its shard once and reads the peers' on its
own copy engines, its GEMMs waiting on events instead of spinning on flags.

Issue 47, built from the 4xH100 run of 2026-11-28 (``bench/results/2026-11-28_tp4_layer_h100x4``): at four
GPUs torch's fused op, which pulls the peers' shards on two alternating streams after a barrier, ran
1.12-1.34x BSP at M=4096, while :mod:`..copy_engine` (pushes on one side stream, the GEMMs waiting on
peer-raised flags with 1-program spin kernels) and :mod:`.ce_fanout` (pushes on a lane per peer) ran
0.92-1.08x. This schedule is torch's direction with this project's channel: no barrier, a lane per
``streams``, GEMMs in arrival order. On rank ``r``:

* lane 0 (forked from the caller's stream, so the input is ready) *publishes*: it waits until every
  peer has finished reading the previous call's shard from ``r``'s slot (the peer's ``done`` token),
  copies ``A_r`` into its own inbox slot ``r`` (a local copy-engine copy) and raises a *ready* flag at
  every peer (``data[r, 0]`` there: the flag slot a push of ``r`` would raise);
* the lanes (the peers dealt round robin, rank-rotated ``r+1, r+2, ...``, lane 0 after publishing) *pull*:
  for each peer ``p`` wait for ``p``'s ready flag and copy ``p``'s slot ``p`` of its inbox into slot
  ``p`` of ``r``'s own, chunk by chunk, each chunk followed by an event;
* the caller's stream runs the local shard's GEMM (from the user's tensor: no wait), then each peer
  chunk's once its event has fired (``gather_dim=0``: its rows of ``C``; ``gather_dim=1``: ``C[rows] +=
  A_p[rows] @ B[p's K rows]``), hands the gathered A out when asked, then tells every peer that it is done
  with its data (``done[r]`` at ``p``) and joins the lanes (:func:`..common.channel.join_lanes`).

``gemms="lanes"`` (a parameter; the default ``caller`` is the schedule above) is torch's fused op's
schedule with this channel (gather_dim=0): each pulled chunk's GEMM runs on the lane that pulled it,
right behind the copy, so with two lanes a shard's copy runs beside the previous shard's GEMM (on 4xH200,
2026-11-28, torch's op ran 7-15% ahead of the caller schedule at N=2560, M 4096-16384, and one lane beat
two or four there); the caller's stream runs the local shard's GEMM and waits for the lanes before the
gathered A is handed out and the ``done`` tokens go.

``done`` means what it means for the push schedules (``r`` no longer reads anything of ``p``'s from this
call: ``p``'s slot, and ``r``'s own slot ``p``), so calls of this schedule and of ``copy_engine`` /
``ce_fanout`` may follow one another on one channel, as different keys of one model do: a push into
``r``'s slot ``p`` waits for it as a publish over ``p``'s own slot does. Raised on the caller's stream
after the GEMMs, not behind each pull: a push of the next call must not land in a slot this call's GEMM
still reads. Each rank's own slot is single-buffered (the tokens keep a peer one call ahead from
overwriting what is still read). Flags, tokens, epoch, arena and lanes are the copy-engine family's
channel (:mod:`..common.channel`), either back end. Nothing the host
passes changes between calls, so a CUDA graph replays it (events recorded and awaited inside a capture
become graph edges). Checked on ranks emulated as threads (2, 3, 4 and 8) and on 2 and 4 H200s
(``autotaxer.ops.ag_gemm.experimental.ce_pull`` says where it was measured).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...common import channel as chan
from ...common import signal as sig
from ...common.channel import MAX_CHUNKS, Channel, fork_lanes
from ...common.lanes import peer_lanes
from .. import copy_engine as ce


@dataclass(frozen=True)
class PullPlan:
    """A copy-engine plan (``base``: rows, chunks, peers in arrival order, this rank's inbox, the peers'
    ``data[r, 0]`` and ``done[r]`` addresses), the lanes, each peer's own slot as this rank addresses it,
    one event per peer and chunk, and where the peers' GEMMs run (``gemms``: ``caller``, the caller's
    stream behind the events; ``lanes``, each chunk's on the lane that pulled it, right behind the copy)."""

    base: ce.Plan
    lanes: tuple[tuple[int, ...], ...]
    remote_slot: tuple[tuple[int, int], ...]  # (peer, address of the peer's own slot in its inbox)
    events: dict[tuple[int, int], Any]  # (peer, chunk) -> event recorded behind that chunk's copy
    gemms: str = "caller"


def _new_events(n: int) -> list[Any]:
    """``n`` CUDA events (made at prepare time: none is created during a CUDA-graph capture)."""
    return [torch.cuda.Event() for _ in range(n)]


def make_pull_plan(
    channel: Channel,
    *,
    m: int,
    k: int,
    gather_dim: int,
    elem: int,
    chunks: int,
    streams: int,
    fp32_accumulate: bool,
    gemms: str = "caller",
) -> PullPlan:
    """Resolve a call's addresses, lanes and events (collective: may grow the channel's arena).
    ``gemms="lanes"`` (gather_dim=0 only: with gather_dim=1 every peer's GEMM adds into the same rows)
    runs each pulled chunk's GEMM on its lane."""
    if gemms not in ("caller", "lanes"):
        raise ValueError(f"gemms: 'caller' or 'lanes', got {gemms!r}")
    if gemms == "lanes" and gather_dim != 0:
        raise ValueError("gemms='lanes' needs gather_dim=0 (with gather_dim=1 the peers' GEMMs share rows)")
    base = ce.make_plan(
        channel, m=m, k=k, gather_dim=gather_dim, elem=elem, chunks=chunks, order="rotated",
        gather_first=False, fp32_accumulate=fp32_accumulate,
    )  # fmt: skip
    slots = tuple((p, channel.remote(base.inbox_ptr + p * base.shard_bytes, p)) for p in base.peers)
    keys = [(p, c) for p in base.peers for c in range(len(base.chunk_rows))]
    events = dict(zip(keys, _new_events(len(keys)), strict=True))
    lanes = peer_lanes(base.peers, streams)
    return PullPlan(base=base, lanes=lanes, remote_slot=slots, events=events, gemms=gemms)


def _publish(ch: Channel, plan: PullPlan, a_shard: Any, stream: Any) -> None:
    """Lane 0: once every peer has read the previous shard, copy this rank's shard into its own slot and
    raise the ready flag at every peer."""
    base = plan.base
    for p in base.peers:
        chan._await(ch, ch.done[p : p + 1], stream, offset=-1)  # p has read the previous call's shard
    own = base.inbox_ptr + ch.rank * base.shard_bytes
    sig.memcpy_async(own, a_shard.data_ptr(), base.shard_bytes, stream)
    for _, ready in base.remote_data:
        chan._raise(ch, ready, stream)


def _pull_lane(
    ch: Channel, plan: PullPlan, a_shard: Any, consume: Any, peers: tuple[int, ...], stream: Any
) -> None:
    """On ``stream`` (the current stream): lane 0 publishes first; then each of ``peers``' shards is
    pulled into this rank's inbox chunk by chunk, an event behind each chunk, and ``consume(p, first,
    n)`` (when given) launches that chunk's GEMM right behind its copy."""
    base = plan.base
    if peers == plan.lanes[0]:
        _publish(ch, plan, a_shard, stream)
    flags = ch.data.view(ch.world_size, MAX_CHUNKS)
    slot_of = dict(plan.remote_slot)
    row_bytes = base.k_shard * base.elem
    for p in peers:
        chan._await(ch, flags[p, 0:1], stream)  # p's shard is in its own slot
        dst = base.inbox_ptr + p * base.shard_bytes
        for c, (first, n) in enumerate(base.chunk_rows):
            off = first * row_bytes
            sig.memcpy_async(dst + off, slot_of[p] + off, n * row_bytes, stream)
            plan.events[(p, c)].record(stream)
            if consume is not None:
                consume(p, first, n)


def ag_gemm_ce_pull(channel: Channel, plan: PullPlan, inbox: Any, a_shard: Any, b: Any, out: Any,
                    acc: Any = None, watch: Any = None, gathered: Any = None) -> Any:  # fmt: skip
    """Compute ``out = all_gather(a_shard) @ b`` with the pull schedule; collective.

    ``inbox`` is the channel's arena viewed as ``a_shard``'s dtype; ``acc`` an fp32 ``out``-shaped
    workspace when ``plan.base.fp32_accumulate``; ``watch`` the watch slot bounding the flag and token
    waits (as in ``copy_engine.ag_gemm_ce``); ``gathered``: an ``(M, K)`` tensor that also receives the
    gathered A (copied from the inbox after the last event, before the peers are told this rank is done
    with their data). Launches only: no host synchronisation, no allocation.
    """
    ch, r, base = channel, channel.rank, plan.base
    rows, ks = base.rows, base.k_shard
    n_rows = rows * ks

    def consume(p: int, first: int, n: int) -> None:  # gather_dim=0: peer p's rows first .. first + n
        a_p = inbox[p * n_rows : (p + 1) * n_rows].view(rows, ks)
        lo = p * rows + first
        torch.matmul(a_p[first : first + n], b, out=out[lo : lo + n])

    on_lanes = consume if plan.gemms == "lanes" else None
    main, lanes = fork_lanes(ch, plan.lanes, watch, _pull_lane, ch, plan, a_shard, on_lanes)
    if base.gather_dim == 0:
        torch.matmul(a_shard, b, out=out[r * rows : (r + 1) * rows])
        if on_lanes is not None:  # the lanes' GEMMs end before anything below (hand-out, done tokens)
            for _, join in lanes:
                main.wait_event(join)
        else:
            for p in base.peers:
                for c, (first, n) in enumerate(base.chunk_rows):
                    main.wait_event(plan.events[(p, c)])
                    consume(p, first, n)
    else:
        target = acc if base.fp32_accumulate else out
        if base.fp32_accumulate:
            torch.mm(a_shard, b[r * ks : (r + 1) * ks], out_dtype=torch.float32, out=target)
        else:
            torch.matmul(a_shard, b[r * ks : (r + 1) * ks], out=target)
        for p in base.peers:
            a_p = inbox[p * n_rows : (p + 1) * n_rows].view(rows, ks)
            b_p = b[p * ks : (p + 1) * ks]
            for c, (first, n) in enumerate(base.chunk_rows):
                main.wait_event(plan.events[(p, c)])
                t = target[first : first + n]
                if base.fp32_accumulate:
                    torch.addmm(t, a_p[first : first + n], b_p, out_dtype=torch.float32, out=t)
                else:
                    t.addmm_(a_p[first : first + n], b_p)
        if base.fp32_accumulate:
            out.copy_(acc)
    if gathered is not None:  # before the peers are told: a push of theirs may land in these slots next
        ce.hand_out(base, inbox, a_shard, gathered, r, ch.world_size)
    chan.join_lanes(ch, base.remote_done, main, lanes)  # done with every peer's data: they may go on
    return out
