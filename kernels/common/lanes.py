"""Side streams (*lanes*) of the copy-engine schedules: the peers dealt round robin to a few streams, so
that copies to different peers run on different copy engines at once, and the streams themselves, made
once per channel and count."""

from __future__ import annotations

from typing import Any


def peer_lanes(peers: tuple[int, ...], streams: int) -> tuple[tuple[int, ...], ...]:
    """``peers`` dealt round robin to ``min(streams, len(peers))`` lanes, each keeping their order."""
    n = max(1, min(streams, len(peers)))
    return tuple(tuple(peers[i::n]) for i in range(n))


_LANE_STREAMS: dict[tuple[int, int], list[tuple[Any, Any]]] = {}  # (channel, lanes) -> (stream, join)


# ``ce.Channel`` is ``autotaxer.kernels.ag_gemm.copy_engine.Channel``; the annotation is kept as it was
# written in ce_fanout, so that the move keeps that variant's records (the restamp tool compares code).
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
