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
from .._base import Op

#: ``b_layout`` values: B row-major ``(K, N)``, or the transpose of a row-major ``(N, K)`` weight.
B_LAYOUTS: tuple[str, ...] = ("kn", "nk")


def b_layout_of(b: Any) -> str:
    """``nk`` when ``b`` is a transposed row-major weight (unit stride down its K rows), else ``kn``."""
    return "nk" if b.stride(0) == 1 and b.stride(1) != 1 else "kn"


def canonical_b(b: Any) -> Any:
    """``b`` itself when the kernels read it in place (``kn`` or ``nk``: unit stride along one dimension,
    rows or columns not overlapping), else a contiguous copy of the same values."""
    in_place = (b.stride(1) == 1 and b.stride(0) >= b.shape[1]) or (
        b.stride(0) == 1 and b.stride(1) >= b.shape[0]
    )
    return b if in_place else b.contiguous()


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


class AgGemm(Op):
    name = "ag_gemm"
    shape_fields = ("M", "N", "K")
    layout_choices = {"gather_dim": (0, 1), "b_layout": B_LAYOUTS}
    #: Layout fields a call's tensors decide (dispatch derives ``b_layout`` from B's strides).
    derived_layout = frozenset({"b_layout"})

    def validate(self, key: ProblemKey) -> None:
        for f in self.shape_fields:
            if key.get(f) is None:
                raise ValueError(f"{f}: missing")
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        gd = key.get("gather_dim")
        if gd not in (0, 1):
            raise ValueError(f"gather_dim: must be 0 or 1, got {gd}")
        if key["b_layout"] not in B_LAYOUTS:
            raise ValueError(f"b_layout: must be one of {', '.join(B_LAYOUTS)}, got {key['b_layout']!r}")
        if key.world_size <= 0:
            raise ValueError(f"world_size: must be positive, got {key.world_size}")
        field = "M" if gd == 0 else "K"
        if key[field] % key.world_size:
            raise ValueError(
                f"{field}: {key[field]} is not divisible by world size {key.world_size} "
                f"(gather_dim={gd} shards {field})"
            )

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, Any], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The key of ``dispatch("ag_gemm", a_shard, b, gather_dim=...)``; ``b_layout`` from B's strides."""
        if len(tensors) != 2:
            raise ValueError(f"ag_gemm: expected 2 tensors (a_shard, b), got {len(tensors)}")
        a, b = tensors
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"ag_gemm: a_shard and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise ValueError(f"dtype: a_shard is {a.dtype} but b is {b.dtype}")
        if a.device != b.device:
            raise ValueError(f"device: a_shard is on {a.device} but b is on {b.device}")
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

    def canonical_inputs(self, tensors: tuple) -> tuple:
        """The inputs as every variant reads them: ``a_shard`` contiguous, ``b`` in ``kn`` or ``nk``
        layout (:func:`canonical_b`); anything else is copied (the same values)."""
        a, b = tensors
        return a.contiguous(), canonical_b(b)

    def needs_canonical(self, tensors: tuple) -> bool:
        """True when :meth:`canonical_inputs` would copy one of ``tensors``."""
        a, b = tensors
        return not a.is_contiguous() or canonical_b(b) is not b

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
