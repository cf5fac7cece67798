"""Device-side synchronisation every fused kernel keeps: the call's epoch from an arrival count and the
translation to a peer's symmetric heap (the bounded spins on flags released at system scope are in
:mod:`.watch`).

No reset between calls: ``sync[0]`` counts every program's arrival (``epoch = arrival // grid + 1``),
flags hold the epoch that raised them and are compared with ``>=``, so CUDA-graph replays see fresh
epochs and nothing is written after a kernel's last tile.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def epoch_begin(sync_ptr, grid, COUNT: tl.constexpr):
    """This call's epoch (int32, from 1) from the arrival count ``sync[0]``; ``COUNT``: add this
    program's arrival (the launch that runs the GEMM; the interpreter's producer-only launches read)."""
    if COUNT:
        arrival = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    else:
        arrival = tl.load(sync_ptr, volatile=True)
    return (arrival // grid + 1).to(tl.int32)


@triton.jit
def heap_delta(ptr, rank, peer, heap_bases):
    """Elements from ``ptr`` to the same heap offset on ``peer`` (the translation ``iris.load`` does).

    Hoisted out of the copy loops as one scalar so the per-element address arithmetic stays
    ``base + row * stride + col`` and its alignment (and so 16-byte vector accesses) stays provable.
    """
    elem: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    return (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // elem
