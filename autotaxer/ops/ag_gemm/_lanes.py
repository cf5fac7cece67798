"""The side-stream counts the copy-engine schedules accept, shared by their variants (``ce_fanout``,
``ce_grouped``, and ``gemm_rs``'s ``copy_engine``)."""

from __future__ import annotations


def _streams_reason(streams: int, peers: int) -> str | None:
    """Why ``streams`` side streams make no sense for ``peers`` peers: lanes are capped at one per peer,
    so of the powers of two only the smallest one that covers every peer is kept."""
    if streams < 1:
        return f"streams: {streams} must be at least 1"
    if streams > 1 and streams // 2 >= peers:
        return f"streams: {streams} for {peers} peers ({streams // 2} already gives each its own)"
    return None
