"""What the matrix-product ops (``ag_gemm``, ``gemm_rs``) share: B's two layouts, the checks of a call's
two tensors and of a key's sizes, the copy of inputs into a layout every variant reads, and the products
their backward passes and traced BSP forms compute in B's own layout."""

from __future__ import annotations

from typing import Any

from .._problem import ProblemKey
from ._base import Op

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


def check_pair(op: str, tensors: tuple, names: tuple[str, str]) -> tuple[Any, Any]:
    """The two 2-D tensors of a call of ``op`` (same dtype and device); ``ValueError`` naming the field."""
    if len(tensors) != 2:
        raise ValueError(f"{op}: expected 2 tensors ({', '.join(names)}), got {len(tensors)}")
    a, b = tensors
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(
            f"{op}: {names[0]} and {names[1]} must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"dtype: {names[0]} is {a.dtype} but {names[1]} is {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"device: {names[0]} is on {a.device} but {names[1]} is on {b.device}")
    return a, b


class MatmulOp(Op):
    """An op of two matrices ``(a, b)``, B in either layout (``b_layout``, from B's strides)."""

    derived_layout = frozenset({"b_layout"})

    def validate_sizes(self, key: ProblemKey, layout: str, split: dict[int, str]) -> None:
        """Every shape field positive, ``b_layout`` known, and the field ``split[key[layout]]`` (the one
        that layout value shards) plus ``K`` where ``split`` names it divisible by the world size."""
        for f in self.shape_fields:
            if key.get(f) is None:
                raise ValueError(f"{f}: missing")
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        value = key.get(layout)
        if value not in split:
            raise ValueError(f"{layout}: must be 0 or 1, got {value}")
        if key["b_layout"] not in B_LAYOUTS:
            raise ValueError(f"b_layout: must be one of {', '.join(B_LAYOUTS)}, got {key['b_layout']!r}")
        if key.world_size <= 0:
            raise ValueError(f"world_size: must be positive, got {key.world_size}")
        field = split[value]
        if key[field] % key.world_size:
            raise ValueError(
                f"{field}: {key[field]} is not divisible by world size {key.world_size} "
                f"({layout}={value} shards {field})"
            )

    def canonical_inputs(self, tensors: tuple) -> tuple:
        """``a`` contiguous, ``b`` in ``kn`` or ``nk`` layout (:func:`canonical_b`); anything else is
        copied (the same values)."""
        a, b = tensors
        return a.contiguous(), canonical_b(b)

    def needs_canonical(self, tensors: tuple) -> bool:
        a, b = tensors
        return not a.is_contiguous() or canonical_b(b) is not b


def gemm_flops(key: ProblemKey) -> float:
    """The full ``(M, K) @ (K, N)`` product."""
    return 2.0 * key["M"] * key["N"] * key["K"]


def partial_gemm_flops(key: ProblemKey) -> float:
    """One rank's partial product over its ``K / world_size`` slice."""
    return gemm_flops(key) / key.world_size


def linear_product(a: Any, b: Any) -> Any:
    """``a @ b`` as plain PyTorch writes it: ``F.linear(a, weight)`` where ``b`` is an nn.Linear weight's
    ``weight.t()``, so autograd computes the weight's gradient in the weight's own layout (through
    ``matmul`` it is made transposed and copied: 4% of a compiled training step on 2xH200)."""
    import torch

    if b_layout_of(b) == "nk":
        return torch.nn.functional.linear(a, b.t())
    return torch.matmul(a, b)


def weight_grad(gathered: Any, grad_out: Any, b: Any) -> Any:
    """``gathered_Aᵀ · grad_C`` in B's own layout (row-major ``(N, K)`` transposed for an ``nk`` weight,
    so the weight's ``.grad`` comes out contiguous)."""
    if b_layout_of(b) == "nk":
        return (grad_out.t() @ gathered).t()
    return gathered.t() @ grad_out
