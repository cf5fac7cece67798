"""``ag_gemm``: all-gather of A shards followed by ``A @ B``, and its variants.

Each variant module in ``_VARIANT_MODULES`` exposes ``VARIANTS``, a list of :class:`Variant` instances.
Modules import Triton/Iris only inside their functions, so registering costs nothing on CPU.
"""

from __future__ import annotations

import importlib
import importlib.util

from ._op import AgGemm

_VARIANT_MODULES = ("bsp", "cpu_chunked", "pull", "push", "copy_engine", "ce_gemm", "planted")

AG_GEMM = AgGemm()
for _name in _VARIANT_MODULES:
    _qual = f"{__name__}.{_name}"
    if importlib.util.find_spec(_qual) is None:
        continue
    for _variant in importlib.import_module(_qual).VARIANTS:
        AG_GEMM.register(_variant)

OP = AG_GEMM

__all__ = ["AG_GEMM", "OP", "AgGemm"]
