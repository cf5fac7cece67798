"""``pull``: one persistent Triton GEMM whose CTAs load remote A tiles from the peers' heaps."""

from __future__ import annotations

from ..._problem import ProblemKey
from ._iris_fused import IrisFusedVariant
from ._op import shard_shape


class PullVariant(IrisFusedVariant):
    name = "pull"
    buffer_arg = "stage"

    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        return (2, *shard_shape(key))

    def launcher(self):
        from autotaxer.kernels.ag_gemm_pull import ag_gemm_pull

        return ag_gemm_pull


VARIANTS = [PullVariant()]
