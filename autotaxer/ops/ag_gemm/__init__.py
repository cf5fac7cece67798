"""``ag_gemm``: all-gather of A shards followed by ``A @ B``, and its variants.

Each variant module in ``_VARIANT_MODULES`` exposes ``VARIANTS``, a list of :class:`Variant` instances.
Modules import Triton/Iris only inside their functions, so registering costs nothing on CPU.
"""

from __future__ import annotations

import importlib

from .._forms import INTEGRATION_KINDS, LayerForm
from .._matmul import gemm_flops
from ._emulated import FORM as EMULATED
from ._op import AgGemm

_VARIANT_MODULES = (
    "bsp",
    "bsp_symm",
    "torch_fused",
    "cpu_chunked",
    "iris_fused",  # pull, push
    "push_tma",
    "copy_engine",
)
#: Opt-in variants (``experimental = True``): registered, tuned only when named.
_EXPERIMENTAL_MODULES = (
    "experimental.push_ws",
    "experimental.ce_fanout",
    "experimental.ce_grouped",
    "experimental.ce_persistent",
    "experimental.ce_pull",
    "experimental.ce_local_rest",
)

AG_GEMM = AgGemm()
# What the op takes part in beyond dispatch and tuning (see ops/_forms.py): every integration; the
# emulated checks it carries, the integration layer (autotaxer/integrations/) holds the others' forms.
AG_GEMM.integrations = frozenset(INTEGRATION_KINDS)
AG_GEMM.forms = {"emulated": EMULATED}
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
# The copy-engine schedules launch 10-30 things a call from Python (~0.5 ms of host time on 2xH200, as much
# as the GPU's): their calls are CUDA-graph replays (autotaxer/runtime/replay.py; all flags on the device).
# So are torch's fused op's (300-450 us of host time a call at 4 ranks; its replay test passed on 2xH200,
# 2026-11-28: bench/results/2026-11-28_ws2_ship_h200x2).
AG_GEMM.replayed = frozenset(
    {"copy_engine", "ce_fanout", "ce_grouped", "ce_persistent", "ce_pull", "ce_local_rest", "torch_fused"}
)
for _name in (*_VARIANT_MODULES, *_EXPERIMENTAL_MODULES):
    for _variant in importlib.import_module(f"{__name__}.{_name}").VARIANTS:
        AG_GEMM.register(_variant)

OP = AG_GEMM

__all__ = ["AG_GEMM", "OP", "AgGemm"]
