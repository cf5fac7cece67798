"""The ``gemm_rs`` problem: shapes, inputs per rank, and the fp32 reference.

Rank r holds ``A_r (M, K/ws)`` and ``B_r (K/ws, N)`` (``b_layout`` ``kn``: row-major; ``nk``: the
transpose of a row-major ``(N, K/ws)`` weight, i.e. a row-parallel nn.Linear's ``weight.t()``). The
result on rank r is its slice of ``C = sum_r A_r @ B_r`` along ``scatter_dim``: rows ``r*M/ws ...``
(0) or columns ``r*N/ws ...`` (1). ``K`` in the key is the full contracted dimension.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, dtype_name, torch_dtype
from .._base import Op
from ..ag_gemm._op import B_LAYOUTS, b_layout_of, canonical_b


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


class GemmRs(Op):
    name = "gemm_rs"
    shape_fields = ("M", "N", "K")
    layout_choices = {"scatter_dim": (0, 1), "b_layout": B_LAYOUTS}
    derived_layout = frozenset({"b_layout"})

    def validate(self, key: ProblemKey) -> None:
        for f in self.shape_fields:
            if key.get(f) is None:
                raise ValueError(f"{f}: missing")
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        sd = key.get("scatter_dim")
        if sd not in (0, 1):
            raise ValueError(f"scatter_dim: must be 0 or 1, got {sd}")
        if key["b_layout"] not in B_LAYOUTS:
            raise ValueError(f"b_layout: must be one of {', '.join(B_LAYOUTS)}, got {key['b_layout']!r}")
        ws = key.world_size
        if key["K"] % ws:
            raise ValueError(f"K: {key['K']} is not divisible by world size {ws} (each rank holds K/ws)")
        field = "M" if sd == 0 else "N"
        if key[field] % ws:
            raise ValueError(
                f"{field}: {key[field]} is not divisible by world size {ws} (scatter_dim={sd} splits {field})"
            )

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, Any], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The key of ``dispatch("gemm_rs", a, b, scatter_dim=...)``; ``b_layout`` from B's strides."""
        if len(tensors) != 2:
            raise ValueError(f"gemm_rs: expected 2 tensors (a, b), got {len(tensors)}")
        a, b = tensors
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"gemm_rs: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise ValueError(f"dtype: a is {a.dtype} but b is {b.dtype}")
        if a.device != b.device:
            raise ValueError(f"device: a is on {a.device} but b is on {b.device}")
        if b.shape[0] != a.shape[1]:
            raise ValueError(f"K: b has {b.shape[0]} rows but a has {a.shape[1]} columns")
        shape = {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1] * world_size}
        full = {"scatter_dim": layout["scatter_dim"], "b_layout": b_layout_of(b)}
        return ProblemKey.make("gemm_rs", gpu_model, world_size, dtype_name(a.dtype), shape, full)

    def canonical_inputs(self, tensors: tuple) -> tuple:
        a, b = tensors
        return a.contiguous(), canonical_b(b)

    def needs_canonical(self, tensors: tuple) -> bool:
        a, b = tensors
        return not a.is_contiguous() or canonical_b(b) is not b

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
