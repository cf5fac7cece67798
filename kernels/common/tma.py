"""Tensor-memory-access (TMA, NVIDIA Hopper and later) pieces of the GEMM cores: descriptors made on the
device, and a K range of one tile loaded by TMA (one ``cp.async.bulk.tensor`` per tile and stage, no
thread holding A's or B's addresses; ragged edges zero-filled). Launches that use them give Triton an
allocator for the descriptors' global scratch (:class:`Scratch`, :func:`scratch_allocator`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import triton
import triton.language as tl


@triton.jit
def tma_k_range(acc, a_desc, a_row, b_desc, b_k0, off_n, k_lo, k_hi, BLOCK_K: tl.constexpr,
                B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    """Accumulate ``A[a_row:, k_lo:k_hi] @ B[b_k0 + k_lo : b_k0 + k_hi, off_n:]`` into ``acc`` by TMA
    loads (``B_ROW_MAJOR``: ``b_desc`` is over ``(K, N)``, else over ``(N, K)`` and transposed)."""
    for k in range(k_lo, k_hi, BLOCK_K):
        a = a_desc.load([a_row, k])
        if B_ROW_MAJOR:
            b = b_desc.load([b_k0 + k, off_n])
        else:
            b = b_desc.load([off_n, b_k0 + k]).T
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def b_descriptor(b_ptr, rows, N, stride_bk, stride_bn, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                 B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    """A descriptor over ``rows`` rows of B from ``b_ptr`` (``(rows, N)``, or ``(N, rows)`` column-major)."""
    if B_ROW_MAJOR:
        return tl.make_tensor_descriptor(b_ptr, [rows, N], [stride_bk, 1], [BLOCK_K, BLOCK_N])
    else:
        return tl.make_tensor_descriptor(b_ptr, [N, rows], [stride_bn, 1], [BLOCK_N, BLOCK_K])


class Scratch:
    """Triton's allocator for device-made TMA descriptors: one buffer, grown on demand, reused."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = None

    def __call__(self, size: int, alignment: int, stream: Any):
        import torch

        if self.buf is None or self.buf.numel() < size:
            self.buf = torch.empty(max(size, 4096), dtype=torch.int8, device="cuda")
        return self.buf


@contextmanager
def scratch_allocator(scratch: Scratch | None) -> Iterator[None]:
    """Triton's allocator set to ``scratch`` for the launches inside (a ContextVar, so graph capture and
    other threads' launches are unaffected); nothing with ``None``."""
    if scratch is None:
        yield
        return
    from triton.runtime import _allocation

    token = _allocation._allocator.set(scratch)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)
