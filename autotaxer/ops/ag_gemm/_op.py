"""The ``ag_gemm`` problem: shapes, inputs per rank, and the fp32 reference.

``gather_dim=0`` (sequence-parallel TP): rank r holds ``A_r (M/ws, K)``; ``C = cat_r(A_r, 0) @ B``.
``gather_dim=1`` (Iris' example layout): rank r holds ``A_r (M, K/ws)``; ``C = cat_r(A_r, 1) @ B``.
Every rank holds the same ``B (K, N)`` and gets the full ``C (M, N)``.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, torch_dtype
from .._base import Op


def shard_shape(key: ProblemKey) -> tuple[int, int]:
    """Shape of one rank's A shard."""
    m, k, ws = key["M"], key["K"], key.world_size
    return (m // ws, k) if key["gather_dim"] == 0 else (m, k // ws)


def _generator(device: Any, seed: int):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _shard(key: ProblemKey, rank: int, device: Any, seed: int):
    import torch

    g = _generator(device, seed * 1009 + 17 * (rank + 1))
    a = torch.randn(shard_shape(key), generator=g, device=device, dtype=torch.float32)
    return a.to(torch_dtype(key.dtype))


def _weight(key: ProblemKey, device: Any, seed: int):
    import torch

    g = _generator(device, seed * 1009 + 3)
    b = torch.randn((key["K"], key["N"]), generator=g, device=device, dtype=torch.float32)
    return (b / key["K"] ** 0.5).to(torch_dtype(key.dtype))


class AgGemm(Op):
    name = "ag_gemm"
    shape_fields = ("M", "N", "K")
    layout_choices = {"gather_dim": (0, 1)}

    def validate(self, key: ProblemKey) -> None:
        for f in self.shape_fields:
            if key.get(f) is None:
                raise ValueError(f"{f}: missing")
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        gd = key.get("gather_dim")
        if gd not in (0, 1):
            raise ValueError(f"gather_dim: must be 0 or 1, got {gd}")
        if key.world_size <= 0:
            raise ValueError(f"world_size: must be positive, got {key.world_size}")
        field = "M" if gd == 0 else "K"
        if key[field] % key.world_size:
            raise ValueError(
                f"{field}: {key[field]} is not divisible by world size {key.world_size} "
                f"(gather_dim={gd} shards {field})"
            )

    def make_inputs(self, key: ProblemKey, rank: int, device: Any, seed: int) -> tuple[Any, ...]:
        """``(a_shard, b)`` for ``rank``."""
        return _shard(key, rank, device, seed), _weight(key, device, seed)

    def reference(self, key: ProblemKey, rank: int, device: Any, seed: int) -> Any:
        import torch

        shards = [_shard(key, r, device, seed).float() for r in range(key.world_size)]
        a = torch.cat(shards, dim=key["gather_dim"])
        b = _weight(key, device, seed).float()
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            return a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        import torch

        return torch.full((key["M"], key["N"]), float("nan"), dtype=torch_dtype(key.dtype), device=device)
