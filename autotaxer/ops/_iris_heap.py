"""The process's Iris symmetric heap.

Iris' default allocator exports DMA-BUFs, which only works on AMD/HIP; on NVIDIA the
``vmem_chunked`` allocator works (verified with remote loads on 2×H200), so autotaxer selects it
itself unless the user already chose one through ``IRIS_ALLOCATOR``.
"""

from __future__ import annotations

import os
from typing import Any

_HEAPS: dict[int, Any] = {}  # one heap per process, keyed by size: the heap is a process-wide resource


def configure_iris_environment() -> None:
    """Set the allocator Iris needs on this platform (NVIDIA: ``vmem_chunked``), keeping a user's choice."""
    import torch

    if torch.version.hip is None:
        os.environ.setdefault("IRIS_ALLOCATOR", "vmem_chunked")


def get_iris(heap_size: int) -> Any:
    """Create (once per process) and return an Iris context with a heap of at least ``heap_size`` bytes."""
    for size, ctx in _HEAPS.items():
        if size >= heap_size:
            return ctx
    if _HEAPS:
        raise RuntimeError(
            f"Iris heap of {max(_HEAPS)} bytes already created in this process; {heap_size} requested. "
            "Create the runtime with a larger heap_size first."
        )
    configure_iris_environment()
    import iris

    ctx = iris.iris(heap_size)
    _HEAPS[heap_size] = ctx
    return ctx


def iris_unavailable(name: str) -> str | None:
    """Why variant ``name`` cannot use Triton and Iris in this installation (None when it can)."""
    try:
        import iris  # noqa: F401
        import triton  # noqa: F401
    except Exception as exc:  # any import failure means the variant cannot run here
        return f"{name}: cannot import triton/iris ({type(exc).__name__}: {exc})"
    return None
