"""``ag_gemm``: all-gather of A shards followed by ``A @ B``, and its variants."""

from __future__ import annotations

from ._op import AgGemm
from .bsp import BspVariant

AG_GEMM = AgGemm()
AG_GEMM.register(BspVariant())

__all__ = ["AG_GEMM", "AgGemm"]
