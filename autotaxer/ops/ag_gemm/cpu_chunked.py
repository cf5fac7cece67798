"""``cpu_chunked``: an overlapped all-gather + GEMM for CPU process groups (gloo).

The local shard is split into ``chunks`` row blocks; every block's all-gather is issued asynchronously up
front, the local shard's product is computed while they travel, then each peer's part is multiplied as
its block arrives. ``order`` picks the peer order: ``ascending`` (rank 0, 1, ...) or ``rotated`` (the
next rank first, as a ring would deliver them). It exists so CI tunes a real search space end to end on
CPU; on GPUs the Iris variants do this job.

``gather_dim=0``: rank r holds ``A_r (M/ws, K)`` and owns output rows ``r*M/ws ...``; blocks split those rows.
``gather_dim=1``: rank r holds ``A_r (M, K/ws)``; ``C = sum_p A_p @ B_p`` with ``B_p`` the p-th K slice of B;
blocks split M, and each arriving block adds its peers' partial products to its output rows.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import shard_shape

CHUNKS = (1, 2, 4, 8)
ORDERS = ("ascending", "rotated")


def _peer_order(rank: int, world_size: int, order: str) -> list[int]:
    peers = [(rank + i) % world_size for i in range(1, world_size)]
    return sorted(peers) if order == "ascending" else peers


class CpuChunkedVariant(Variant):
    name = "cpu_chunked"
    device_types = frozenset({"cpu"})

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"chunks": CHUNKS, "order": ORDERS}

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        chunks = params.get("chunks")
        if chunks not in CHUNKS:
            return f"chunks: expected one of {CHUNKS}, got {chunks!r}"
        if params.get("order") not in ORDERS:
            return f"order: expected one of {ORDERS}, got {params.get('order')!r}"
        rows = shard_shape(key)[0]
        if rows % chunks:
            return f"chunks: {chunks} does not divide the shard's {rows} rows"
        return None

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        rows, cols = shard_shape(key)
        block = rows // params["chunks"]
        dtype = torch_dtype(key.dtype)
        gathered = torch.empty(
            (params["chunks"], ctx.world_size, block, cols), dtype=dtype, device=ctx.device
        )
        return Workspace(key, dict(params), {"gathered": gathered})

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        key = ws.key
        if out is None:
            out = torch.empty((key["M"], key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        gathered = ws.buffers["gathered"]
        n_chunks, block = gathered.shape[0], gathered.shape[2]
        works = [
            self._gather_async(a_shard[i * block : (i + 1) * block], gathered[i], ctx)
            for i in range(n_chunks)
        ]
        peers = _peer_order(ctx.rank, ctx.world_size, ws.params["order"])
        rows = a_shard.shape[0]
        if key["gather_dim"] == 0:
            # Local rows first: they need no communication.
            torch.matmul(a_shard, b, out=out[ctx.rank * rows : (ctx.rank + 1) * rows])
            for i, work in enumerate(works):
                if work is not None:
                    work.wait()
                for p in peers:
                    lo = p * rows + i * block
                    torch.matmul(gathered[i, p], b, out=out[lo : lo + block])
        else:
            kr = a_shard.shape[1]
            torch.matmul(a_shard, b[ctx.rank * kr : (ctx.rank + 1) * kr], out=out)
            for i, work in enumerate(works):
                if work is not None:
                    work.wait()
                rows_i = out[i * block : (i + 1) * block]
                for p in peers:
                    rows_i.addmm_(gathered[i, p], b[p * kr : (p + 1) * kr])
        return out

    @staticmethod
    def _gather_async(part: Any, dest: Any, ctx: RunContext) -> Any:
        """Start gathering one block into ``dest`` (``(world_size, *part.shape)``); the Work or None."""
        if ctx.world_size == 1:
            dest[0].copy_(part)
            return None
        import torch.distributed as dist

        return dist.all_gather(list(dest.unbind(0)), part.contiguous(), group=ctx.group, async_op=True)


VARIANTS = [CpuChunkedVariant()]
