"""The ``gemm_rs`` problem: shapes, inputs per rank, and the fp32 reference.

Rank r holds ``A_r (M, K/ws)`` and ``B_r (K/ws, N)`` (``b_layout`` ``kn``: row-major; ``nk``: the
transpose of a row-major ``(N, K/ws)`` weight, i.e. a row-parallel nn.Linear's ``weight.t()``). The
result on rank r is its slice of ``C = sum_r A_r @ B_r`` along ``scatter_dim``: rows ``r*M/ws ...``
(0) or columns ``r*N/ws ...`` (1). ``K`` in the key is the full contracted dimension.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, dtype_name, torch_dtype
from .._matmul import B_LAYOUTS, MatmulOp, b_layout_of, check_pair


def out_shape(key: ProblemKey) -> tuple[int, int]:
    """Shape of one rank's output slice."""
    m, n, ws = key["M"], key["N"], key.world_size
    return (m // ws, n) if key["scatter_dim"] == 0 else (m, n // ws)


def _generator(device: Any, seed: int):
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def _a(key: ProblemKey, rank: int, device: Any, seed: int):
    import torch

    g = _generator(device, seed * 1009 + 17 * (rank + 1))
    a = torch.randn((key["M"], key["K"] // key.world_size), generator=g, device=device)
    return a.to(torch_dtype(key.dtype))


def _b(key: ProblemKey, rank: int, device: Any, seed: int):
    """Rank ``rank``'s ``B_r (K/ws, N)`` (each rank holds its own rows of the weight)."""
    import torch

    g = _generator(device, seed * 1009 + 3 + 31 * (rank + 1))
    ks, n, scale = key["K"] // key.world_size, key["N"], key["K"] ** 0.5
    if key["b_layout"] == "nk":
        w = torch.randn((n, ks), generator=g, device=device) / scale
        return w.to(torch_dtype(key.dtype)).t()
    return (torch.randn((ks, n), generator=g, device=device) / scale).to(torch_dtype(key.dtype))


class GemmRs(MatmulOp):
    """GEMM + reduce-scatter: rank r holds ``A_r (M, K/ws)`` and ``B_r (K/ws, N)`` and gets its slice,
    along ``scatter_dim``, of ``sum_r A_r @ B_r`` (``b_layout`` from B's strides)."""

    name = "gemm_rs"
    shape_fields = ("M", "N", "K")
    layout_choices = {"scatter_dim": (0, 1), "b_layout": B_LAYOUTS}

    def validate(self, key: ProblemKey) -> None:
        self.validate_sizes(key, "scatter_dim", {0: "M", 1: "N"})
        if key["K"] % key.world_size:
            raise ValueError(
                f"K: {key['K']} is not divisible by world size {key.world_size} (each rank holds K/ws)"
            )

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, Any], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The key of ``dispatch("gemm_rs", a, b, scatter_dim=...)``; ``b_layout`` from B's strides."""
        a, b = check_pair("gemm_rs", tensors, ("a", "b"))
        if b.shape[0] != a.shape[1]:
            raise ValueError(f"K: b has {b.shape[0]} rows but a has {a.shape[1]} columns")
        shape = {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1] * world_size}
        full = {"scatter_dim": layout["scatter_dim"], "b_layout": b_layout_of(b)}
        return ProblemKey.make("gemm_rs", gpu_model, world_size, dtype_name(a.dtype), shape, full)

    def make_inputs(self, key: ProblemKey, rank: int, device: Any, seed: int) -> tuple[Any, ...]:
        """``(a_r, b_r)`` for ``rank``."""
        return _a(key, rank, device, seed), _b(key, rank, device, seed)

    def reference(self, key: ProblemKey, rank: int, device: Any, seed: int) -> Any:
        import torch

        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            parts = [
                _a(key, r, device, seed).float() @ _b(key, r, device, seed).float()
                for r in range(key.world_size)
            ]
            total = sum(parts)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return total.chunk(key.world_size, dim=key["scatter_dim"])[rank].contiguous()

    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        import torch

        return torch.full(out_shape(key), float("nan"), dtype=torch_dtype(key.dtype), device=device)

    def bytes_per_rank(self, key: ProblemKey) -> int:
        """A_r, B_r, the full partial product and the output slice, plus the fp32 reference."""
        m, n, k, ws = key["M"], key["N"], key["K"], key.world_size
        elem = {"bf16": 2, "fp16": 2, "fp32": 4}[key.dtype]
        inputs = m * k // ws + k * n // ws
        return elem * (inputs + m * n + m * n // ws) + 4 * (inputs + 2 * m * n)
