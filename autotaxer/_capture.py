"""What every CUDA-graph capture of the project runs inside (:func:`gc_paused`); no torch import."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside (as it was after): every CUDA-graph capture runs in
    one. A collection during a capture may free a CUDA graph (one held in a reference cycle), and freeing
    a graph releases its memory, which is not permitted while a stream captures: its reset failed and a
    later replay crashed the process (2xH200, 2026-11-28: "operation not permitted when stream is
    capturing (function reset)", then a segmentation fault in a replay, in the layer's in-step check)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
