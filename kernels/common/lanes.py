"""Side streams (*lanes*) of the copy-engine schedules: the peers dealt round robin to a few streams, so
that copies to different peers run on different copy engines at once, the streams themselves, made
once per channel and count, and which stream counts a search space keeps (``_streams_reason``, the
variants' pruning rule: moved here from ``autotaxer/ops/ag_gemm/_lanes.py`` under its name, so that
``gemm_rs`` needs nothing of ``ag_gemm`` and ``ce_fanout``'s record stays current)."""

from __future__ import annotations

from typing import Any


def peer_lanes(peers: tuple[int, ...], streams: int) -> tuple[tuple[int, ...], ...]:
    """``peers`` dealt round robin to ``min(streams, len(peers))`` lanes, each keeping their order."""
    n = max(1, min(streams, len(peers)))
    return tuple(tuple(peers[i::n]) for i in range(n))


_LANE_STREAMS: dict[tuple[int, int], list[tuple[Any, Any]]] = {}  # (channel, lanes) -> (stream, join)


# ``ce.Channel`` is :class:`.channel.Channel`; the annotation is kept as it was written in ce_fanout, so
# that the move keeps that variant's records (the restamp tool compares code).
def lane_streams(ch: ce.Channel, n: int) -> list[tuple[Any, Any]]:  # noqa: F821
    """``n`` (stream, join event) pairs for ``ch``: the channel's side stream first, then streams of
    their own (created once per channel and count, reused by every call; call it at prepare time so
    that none is created during a CUDA-graph capture)."""
    import torch

    key = (id(ch), n)
    if key not in _LANE_STREAMS:
        extra = [(torch.cuda.Stream(device=ch.data.device), torch.cuda.Event()) for _ in range(n - 1)]
        _LANE_STREAMS[key] = [(ch.side, ch.join), *extra]
    return _LANE_STREAMS[key]


def _streams_reason(streams: int, peers: int) -> str | None:
    """Why ``streams`` side streams make no sense for ``peers`` peers: lanes are capped at one per peer,
    so of the powers of two only the smallest one that covers every peer is kept."""
    if streams < 1:
        return f"streams: {streams} must be at least 1"
    if streams > 1 and streams // 2 >= peers:
        return f"streams: {streams} for {peers} peers ({streams // 2} already gives each its own)"
    return None
