"""What ``autotaxer bench`` times in a ``gemm_rs`` row besides BSP, its variants and dispatch: the
reduce-scatter of the partial product alone and the local ``A_r @ B_r`` alone (the ceiling of a fused
kernel is the slower of them), and PyTorch's ``fused_matmul_reduce_scatter`` (scatter_dim=0)."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..._problem import ProblemKey
from .._base import RunContext
from .._forms import BenchForm, Peer
from .._torch_symm import symm_group_name
from ._op import out_shape
from .bsp import reduce_scatter


def _parts(key: ProblemKey, ctx: RunContext, inputs: tuple, ws: Any) -> dict[str, Any]:
    """The reduce-scatter of BSP's partial product, and the local GEMM."""
    import torch

    partial_product = ws.buffers["partial"]
    rs_out = torch.empty(out_shape(key), dtype=partial_product.dtype, device=ctx.device)
    return {
        "reduce_scatter": partial(reduce_scatter, partial_product, rs_out, key["scatter_dim"], ctx.group),
        "gemm": partial(torch.matmul, inputs[0], inputs[1], out=torch.empty_like(partial_product)),
    }


def _torch_fused(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    import torch

    group_name = symm_group_name()
    a, b = inputs
    return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)


FORM = BenchForm(
    parts=_parts,
    # torch's symmetric memory must run its CUDA backend: beside bsp_symm (NCCL's), a group of its own
    peers={
        "torch_fused": Peer(
            lambda key: key["scatter_dim"] == 0, _torch_fused, apart_from=frozenset({"bsp_symm"})
        )
    },
)
