"""GEMM + reduce-scatter by the copy engine: each owner's slice of the partial product is computed in
rotated order and copied to its owner by the copy engine while the GEMMs of the next slices run.

Schedule of one call on rank ``r`` (0 SMs for communication):

* caller's stream: for each owner ``p = r+1, r+2, ... , r-1`` the vendor GEMM of ``p``'s slice of
  ``A_r @ B_r`` (``scatter_dim=0``: its rows of A; ``1``: its columns of B) into a local staging slot,
  each followed by an event; then the own slice's GEMM, straight into this rank's inbox slot ``r``;
* side streams (*lanes*, the owners dealt round robin as in ``ag_gemm``'s ``ce_fanout``): for each of
  their owners, wait for the slice's event and for the owner to have consumed this rank's previous data,
  copy the slice into slot ``r`` of the owner's inbox (``cuMemcpyAsync`` over NVLink) and raise its flag;
* caller's stream: wait for every source's flag (source ``r-1`` computes this rank's slice first) and
  sum the ``W`` slots into ``out`` (fp32 accumulation, the input dtype out), then tell every source
  that its slot may be overwritten, and join the lanes.

The partials travel in the input dtype, as NCCL's reduce-scatter of BSP's GEMM output does. Flags,
tokens, the inbox arena and the epoch are the copy-engine channel (:mod:`..common.channel`): the same
protocol, one channel per heap and signalling back end, shared by every copy-engine call of either op.
CUDA-graph safe: nothing the host decides differs from call to call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common import channel as ce
from ..common import signal as sig
from ..common.lanes import lane_streams, peer_lanes


@dataclass(frozen=True)
class RsPlan:
    """Everything a call needs, resolved at prepare time."""

    scatter_dim: int
    mo: int  # rows of one owner's slice
    no: int  # columns of one owner's slice
    elem: int
    owners: tuple[int, ...]  # peers in the order their slices are computed: r+1, r+2, ...
    inbox_ptr: int  # this rank's inbox (W slots, slot s = source s's partial of this rank's slice)
    remote_slot: tuple[tuple[int, int], ...]  # (owner, address of this rank's slot in owner's inbox)
    remote_data: tuple[tuple[int, int], ...]  # (owner, address of owner's data[rank, 0])
    remote_done: tuple[tuple[int, int], ...]  # (source, address of source's done[rank])
    lanes: tuple[tuple[int, ...], ...]  # the owners dealt to the side streams (one tuple a stream)

    @property
    def slice_bytes(self) -> int:
        return self.mo * self.no * self.elem


def make_rs_plan(channel: ce.Channel, *, m: int, n: int, scatter_dim: int, elem: int, streams: int) -> RsPlan:
    """Resolve a call's addresses and lanes (collective: may grow the channel's arena)."""
    ws, r = channel.world_size, channel.rank
    mo, no = (m // ws, n) if scatter_dim == 0 else (m, n // ws)
    slice_bytes = mo * no * elem
    inbox = channel.arena(ws * slice_bytes).data_ptr()
    owners = ce.peer_order(r, ws, "rotated")
    data0 = channel.data.data_ptr() + r * ce.MAX_CHUNKS * 4
    done = channel.done.data_ptr() + r * 4
    return RsPlan(
        scatter_dim=scatter_dim, mo=mo, no=no, elem=elem, owners=owners, lanes=peer_lanes(owners, streams),
        inbox_ptr=inbox,
        remote_slot=tuple((p, channel.remote(inbox + r * slice_bytes, p)) for p in owners),
        remote_data=tuple((p, channel.remote(data0, p)) for p in owners),
        remote_done=tuple((p, channel.remote(done, p)) for p in owners),
    )  # fmt: skip


def _slice_product(plan: RsPlan, a: Any, b: Any, p: int, out: Any) -> None:
    """``out`` = owner ``p``'s slice of ``a @ b``."""
    import torch

    if plan.scatter_dim == 0:
        torch.matmul(a[p * plan.mo : (p + 1) * plan.mo], b, out=out)
    else:
        torch.matmul(a, b[:, p * plan.no : (p + 1) * plan.no], out=out)


def gemm_rs_ce(
    channel: ce.Channel,
    plan: RsPlan,
    inbox: Any,
    staging: Any,
    ready: list[Any],
    a: Any,
    b: Any,
    out: Any,
    watch: Any = None,
) -> Any:
    """``out`` = this rank's slice of ``sum_r a_r @ b_r``; collective.

    ``inbox``: the channel's arena viewed as ``a``'s dtype; ``staging``: ``(W - 1, mo, no)`` local slots,
    one per owner in ``plan.owners`` order; ``ready``: one CUDA event per owner; ``watch``: the watch slot
    bounding the flag waits (as in ``ag_gemm.copy_engine.ag_gemm_ce``). Launches only."""
    import torch

    ch, r, ws = channel, channel.rank, channel.world_size
    ch.watch = watch
    main = torch.cuda.current_stream()
    if ch.backend == "triton":
        sig.advance_epoch(ch.epoch)
    slot_of = {p: i for i, p in enumerate(plan.owners)}
    for p in plan.owners:
        _slice_product(plan, a, b, p, staging[slot_of[p]])
        ready[slot_of[p]].record(main)
    lanes = lane_streams(ch, len(plan.lanes))
    dst_of, data_of = dict(plan.remote_slot), dict(plan.remote_data)
    for (stream, join), owners in zip(lanes, plan.lanes, strict=True):
        with torch.cuda.stream(stream):  # the triton back end's flag kernels run on the current stream
            for p in owners:
                stream.wait_event(ready[slot_of[p]])
                ce._await(ch, ch.done[p : p + 1], stream, offset=-1)  # p has reduced this rank's last slice
                sig.memcpy_async(dst_of[p], staging[slot_of[p]].data_ptr(), plan.slice_bytes, stream)
                ce._raise(ch, data_of[p], stream)
        join.record(stream)
    slots = inbox[: ws * plan.mo * plan.no].view(ws, plan.mo, plan.no)
    _slice_product(plan, a, b, r, slots[r])
    flags = ch.data.view(ws, ce.MAX_CHUNKS)
    for s in reversed(plan.owners):  # source r-1 computed this rank's slice first
        ce._await(ch, flags[s, 0:1], main)
    torch.sum(slots, dim=0, out=out)  # fp32 accumulation for bf16/fp16 inputs
    ce.join_lanes(ch, plan.remote_done, main, lanes)  # the sources' slots here are consumed: reusable
    return out
