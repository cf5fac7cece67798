"""The ``ag_gemm`` problem: shapes, inputs per rank, and the fp32 reference.

``gather_dim=0`` (sequence-parallel TP): rank r holds ``A_r (M/ws, K)``; ``C = cat_r(A_r, 0) @ B``.
``gather_dim=1`` (Iris' example layout): rank r holds ``A_r (M, K/ws)``; ``C = cat_r(A_r, 1) @ B``.
Every rank holds the same ``B (K, N)`` and gets the full ``C (M, N)``. ``b_layout`` is how B is stored:
``kn`` row-major ``(K, N)``, ``nk`` the transpose of a row-major ``(N, K)`` weight (``linear.weight.t()``,
how tensor-parallel frameworks hold a column-parallel weight); kernels run both, tuned separately.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, dtype_name, torch_dtype
from .._matmul import B_LAYOUTS, MatmulOp, b_layout_of, canonical_b, check_pair

__all__ = ["B_LAYOUTS", "AgGemm", "b_layout_of", "canonical_b", "shard_shape"]


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
    """B ``(K, N)``: row-major for ``b_layout=kn``; for ``nk`` the transpose of a row-major ``(N, K)``."""
    import torch

    g = _generator(device, seed * 1009 + 3)
    if key["b_layout"] == "nk":
        w = torch.randn((key["N"], key["K"]), generator=g, device=device, dtype=torch.float32)
        return (w / key["K"] ** 0.5).to(torch_dtype(key.dtype)).t()
    b = torch.randn((key["K"], key["N"]), generator=g, device=device, dtype=torch.float32)
    return (b / key["K"] ** 0.5).to(torch_dtype(key.dtype))


class AgGemm(MatmulOp):
    name = "ag_gemm"
    shape_fields = ("M", "N", "K")
    layout_choices = {"gather_dim": (0, 1), "b_layout": B_LAYOUTS}

    def validate(self, key: ProblemKey) -> None:
        self.validate_sizes(key, "gather_dim", {0: "M", 1: "K"})

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, Any], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The key of ``dispatch("ag_gemm", a_shard, b, gather_dim=...)``; ``b_layout`` from B's strides."""
        a, b = check_pair("ag_gemm", tensors, ("a_shard", "b"))
        gd = layout["gather_dim"]
        m, k = (a.shape[0] * world_size, a.shape[1]) if gd == 0 else (a.shape[0], a.shape[1] * world_size)
        if b.shape[0] != k:
            raise ValueError(
                f"K: b has {b.shape[0]} rows but the gathered A has K={k} "
                f"(a_shard {tuple(a.shape)}, gather_dim={gd}, world size {world_size})"
            )
        shape = {"M": m, "N": b.shape[1], "K": k}
        full = {"gather_dim": gd, "b_layout": b_layout_of(b)}
        return ProblemKey.make("ag_gemm", gpu_model, world_size, dtype_name(a.dtype), shape, full)

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

    def bytes_per_rank(self, key: ProblemKey) -> int:
        """A shard, B, the output and the gathered A in the key's dtype, plus the fp32 reference (all
        shards, B and C)."""
        m, n, k = key["M"], key["N"], key["K"]
        elem = {"bf16": 2, "fp16": 2, "fp32": 4}[key.dtype]
        return elem * (m * k // key.world_size + k * n + m * n + m * k) + 4 * (m * k + k * n + m * n)

    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        import torch

        return torch.full((key["M"], key["N"]), float("nan"), dtype=torch_dtype(key.dtype), device=device)
