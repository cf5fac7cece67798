"""``push``: producer CTAs store the local shard into the peers' inboxes; the GEMM reads locally."""

from __future__ import annotations

from ..._problem import ProblemKey
from ._iris_fused import IrisFusedVariant
from ._op import shard_shape


class PushVariant(IrisFusedVariant):
    name = "push"

    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        from autotaxer.kernels.ag_gemm.fused import inbox_shape

        return inbox_shape(*shard_shape(key), key.world_size)

    def launcher(self):
        from autotaxer.kernels.ag_gemm.push import ag_gemm_push

        return ag_gemm_push


VARIANTS = [PushVariant()]
