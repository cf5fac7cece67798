"""``torch_fused``: PyTorch's own ``fused_all_gather_matmul`` as a tuned candidate (NVIDIA, torch's CUDA
symmetric-memory backend).

What PyTorch's async TP runs: the shard is copied into symmetric memory and each peer's shard is
multiplied as it arrives (one GEMM a peer, on a side stream's copies). On 2xH200 it is the fastest form
users have at large M in nn.Linear's layout (x1.14 over the fastest BSP form at M=4096, N=K=8192) and
far behind at small M (x0.56 at M=64), so it competes per key like every variant
(:class:`~autotaxer.ops._torch_symm.TorchFusedForm`).
"""

from __future__ import annotations

from typing import Any

from .._base import RunContext, Variant, Workspace
from .._torch_symm import TorchFusedForm, all_gather_matmul


class TorchFusedVariant(TorchFusedForm, Variant):
    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        a_shard, b = inputs
        _, (c,) = all_gather_matmul(
            a_shard, [b], ws.key["gather_dim"], ws.buffers["group_name"], return_A=False
        )
        return c if out is None else out.copy_(c)

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C, gathered A)``: torch's op returns the A it gathered (a fresh tensor)."""
        a_shard, b = inputs
        a, (c,) = all_gather_matmul(
            a_shard, [b], ws.key["gather_dim"], ws.buffers["group_name"], return_A=True
        )
        return c, a


VARIANTS = [TorchFusedVariant()]
