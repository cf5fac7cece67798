"""What ``autotaxer bench`` times in an ``ag_gemm`` row besides BSP, its variants and dispatch: the
all-gather alone and the full GEMM alone (the ceiling of a fused kernel is the slower of them), PyTorch's
``fused_all_gather_matmul`` (gather_dim=0) and Iris' stock ``all_gather_matmul`` (gather_dim=1, in a
process group of its own: it may hang)."""

from __future__ import annotations

from functools import partial
from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import RunContext
from .._forms import BenchForm, Peer
from .._torch_symm import symm_group_name
from .bsp import all_gather_shards


def _parts(key: ProblemKey, ctx: RunContext, inputs: tuple, ws: Any) -> dict[str, Any]:
    """The all-gather into BSP's buffer, and the full ``A @ B``."""
    import torch

    a_full = torch.randn((key["M"], key["K"]), device=ctx.device).to(torch_dtype(key.dtype))
    gemm_out = torch.empty((key["M"], key["N"]), dtype=a_full.dtype, device=ctx.device)
    return {
        "allgather": partial(all_gather_shards, inputs[0], ws.buffers["gathered"], ctx),
        "gemm": partial(torch.matmul, a_full, inputs[1], out=gemm_out),
    }


def _torch_fused(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    import torch

    group_name = symm_group_name()
    a, b = inputs
    return lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group_name)[1][0]


def _iris_stock(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    """Iris' stock kernel on a copy of the shard in the symmetric heap."""
    import iris.ops

    from . import AG_GEMM

    shmem = ctx.iris()
    a_shard, b = inputs
    a_sym = shmem.empty(a_shard.shape, dtype=a_shard.dtype)
    a_sym.copy_(a_shard)
    out = AG_GEMM.empty_output(key, ctx.device)
    shmem.barrier()
    wsp = iris.ops.all_gather_matmul_preamble(shmem, a_sym, b)

    def run() -> Any:
        iris.ops.all_gather_matmul(shmem, out, a_sym, b, workspace=wsp)
        return out

    return run


FORM = BenchForm(
    parts=_parts,
    peers={
        # torch's symmetric memory must run its CUDA backend: beside bsp_symm (NCCL's), a group of its own
        "torch_fused": Peer(
            lambda key: key["gather_dim"] == 0, _torch_fused, apart_from=frozenset({"bsp_symm"})
        ),
        # Iris ships an all-gather + GEMM for gather_dim=1 only; it may hang, so it always runs apart
        "iris_stock": Peer(
            lambda key: key["gather_dim"] == 1 and key["K"] % key.world_size == 0,
            _iris_stock,
            alone=True,
            group_by=lambda key: (key["N"], key["K"], key.dtype),
        ),
    },
)
