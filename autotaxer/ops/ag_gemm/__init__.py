"""``ag_gemm``: all-gather of A shards followed by ``A @ B``, and its variants.

Each variant module in ``_VARIANT_MODULES`` exposes ``VARIANTS``, a list of :class:`Variant` instances.
Modules import Triton/Iris only inside their functions, so registering costs nothing on CPU.
"""

from __future__ import annotations

import importlib
import importlib.util

from .._forms import INTEGRATION_MODULES, LayerForm
from .._matmul import gemm_flops
from ._op import AgGemm

_VARIANT_MODULES = (
    "bsp",
    "bsp_symm",
    "torch_fused",
    "cpu_chunked",
    "pull",
    "push",
    "push_tma",
    "copy_engine",
)
#: Opt-in variants (``experimental = True``): registered, tuned only when named.
_EXPERIMENTAL_MODULES = (
    "experimental.push_ws",
    "experimental.ce_fanout",
    "experimental.ce_grouped",
    "experimental.ce_persistent",
)
#: The planted faults of the tuner's tests (registered only with AUTOTAXER_PLANTED_VARIANTS=1).
_TEST_MODULES = ("autotaxer.testing.planted",)

AG_GEMM = AgGemm()
# What the op takes part in beyond dispatch and tuning (see ops/_forms.py), each integration a module here.
AG_GEMM.integrations = dict(INTEGRATION_MODULES)  # every one
AG_GEMM.function_names = ("fused_all_gather_matmul",)
AG_GEMM.layer = LayerForm("column", {"gather_dim": 0})  # sequence-parallel: the input's rows gathered
AG_GEMM.flops = gemm_flops  # every rank computes the full product
# The Triton GEMM variants' tiles, producer counts and row chunks are chosen for the number of tile waves
# at the tuned M. Reused at a neighbouring M (four H200 runs, graph-timed) they lost to BSP in 6 of 8
# cases (0.74-0.99x; M=256's push at M=128: 0.88x on 2 GPUs, 0.75x on 4), while copy_engine's chunking
# carried over in all 20 (1.08-1.39x): bench/results/2026-11-22_ws4_h200x4/nearest_reuse.md.
# ce_persistent's GEMM is the same persistent Triton consumer, its tiles and chunks chosen for the same waves.
AG_GEMM.tied_to_size = frozenset({"pull", "push", "push_tma", "push_ws", "push_ws_fwd", "ce_persistent"})
# The copy-engine schedules for many peers join the default space from 3 ranks on: the 4- and 8-GPU runs
# measure them beside copy_engine, and decide which of the three stay (issue 26).
AG_GEMM.default_from_world_size = {"ce_fanout": 3, "ce_grouped": 3}
for _qual in (*(f"{__name__}.{n}" for n in (*_VARIANT_MODULES, *_EXPERIMENTAL_MODULES)), *_TEST_MODULES):
    if importlib.util.find_spec(_qual) is None:
        continue
    for _variant in importlib.import_module(_qual).VARIANTS:
        AG_GEMM.register(_variant)

OP = AG_GEMM

__all__ = ["AG_GEMM", "OP", "AgGemm"]
