"""``gemm_rs``: a GEMM whose partial products are summed over the ranks and scattered, and its variants.

The row-parallel half of tensor parallelism (and the backward of ``ag_gemm``): each rank holds
``A_r (M, K/ws)`` and ``B_r (K/ws, N)``; every rank gets its slice of ``sum_r A_r @ B_r`` along
``scatter_dim`` (0: rows, ``(M/ws, N)``; 1: columns, ``(M, N/ws)``), PyTorch's
``fused_matmul_reduce_scatter`` contract. Variants: ``bsp`` (GEMM + NCCL ``reduce_scatter_tensor``),
``bsp_symm`` (the same on NCCL symmetric-memory windows), ``push`` and ``push_tma`` (fused: tiles pushed
to their owner as they finish, reduced there; Iris) and ``copy_engine`` (owners' slices in rotated order,
each copied to its owner by the copy engine while the next slices' GEMMs run).
"""

from __future__ import annotations

import importlib

from .._forms import INTEGRATION_KINDS, LayerForm
from .._matmul import partial_gemm_flops
from ._emulated import FORM as EMULATED
from ._op import GemmRs

_VARIANT_MODULES = ("bsp", "bsp_symm", "torch_fused", "push", "copy_engine")

GEMM_RS = GemmRs()
# What the op takes part in beyond dispatch and tuning (see ops/_forms.py): every integration; the
# emulated checks it carries, the integration layer (autotaxer/integrations/) holds the others' forms.
GEMM_RS.integrations = frozenset(INTEGRATION_KINDS)
GEMM_RS.forms = {"emulated": EMULATED}
GEMM_RS.function_names = ("fused_matmul_reduce_scatter",)
GEMM_RS.layer = LayerForm("row", {"scatter_dim": 0})  # sequence-parallel: the output's rows scattered
GEMM_RS.flops = partial_gemm_flops  # each rank's partial product over its K slice
GEMM_RS.replayed = frozenset({"copy_engine", "torch_fused"})  # CUDA-graph replays, as ag_gemm's
for _name in _VARIANT_MODULES:
    for _variant in importlib.import_module(f"{__name__}.{_name}").VARIANTS:
        GEMM_RS.register(_variant)

OP = GEMM_RS

__all__ = ["GEMM_RS", "OP", "GemmRs"]
