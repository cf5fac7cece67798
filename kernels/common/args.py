"""Argument groups every fused kernel of the package takes alike (``ag_gemm``'s and ``gemm_rs``'s: their
``args`` modules add the groups of their own and say what each field holds for them).

A group is a named tuple: Triton passes its fields to the compiled kernel as separate parameters, in
order, and specialises each field as it would a parameter of its own, so grouping changes neither the
compiled code nor the launch. Light: no torch or Triton import.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Io(NamedTuple):
    """The call's tensors, swapped in per call: this rank's A (shard or K slice), B and its output C."""

    a: Any
    b: Any
    c: Any


class Buffers(NamedTuple):
    """The workspace: the inbox (two parity slots a rank: ``ag_gemm`` its shards, ``gemm_rs`` its partial
    slices) and flags in the symmetric heap, the sync words (epoch, tile queue or arrivals), the heap bases
    of every rank and the watch slot bounding the waits."""

    inbox: Any
    flags: Any
    sync: Any
    heap_bases: Any
    watch: Any
