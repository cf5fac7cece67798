"""``pull``: producer CTAs load the peers' staged shards into the local inbox; the GEMM reads locally."""

from __future__ import annotations

from ..._problem import ProblemKey
from ._iris_fused import IrisFusedVariant
from ._op import shard_shape


class PullVariant(IrisFusedVariant):
    name = "pull"
    pushes = False

    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        from autotaxer.kernels.ag_gemm.fused import inbox_shape

        return inbox_shape(*shard_shape(key), key.world_size)

    def launcher(self):
        from autotaxer.kernels.ag_gemm.pull import ag_gemm_pull

        return ag_gemm_pull


VARIANTS = [PullVariant()]
