"""``fused_matmul_reduce_scatter``: ``torch.ops.symm_mem.fused_matmul_reduce_scatter``'s contract,
served by dispatch (:mod:`autotaxer.functional` exports it): ``A @ B`` on every rank, summed (or averaged)
over the group and scattered along ``scatter_dim`` of the product, as one tuned ``gemm_rs``."""

from __future__ import annotations

from typing import Any

import torch

from ...functional import _group_arg


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: Any = None
) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of ``sum over ranks of A @ B`` (``reduce_op`` ``"sum"``
    or ``"avg"``); collective. ``A`` is ``(..., K_r)``, ``B`` ``(K_r, N)`` (row-major or ``weight.t()``).
    """
    from ...runtime.agreement import calling, refuse
    from ...runtime.custom_op import compiled_call
    from ...runtime.dispatch import runtime_for

    group = _group_arg(group_name)
    error = _arguments_error(A, B, reduce_op, scatter_dim)
    if error is not None:  # told to every rank: each raises, none waits for this one
        refuse("gemm_rs", group, ValueError(f"fused_matmul_reduce_scatter: {error}"))
    out_dims = A.dim()  # the product has A's dims, its last one N
    scatter_dim %= out_dims
    if scatter_dim == out_dims - 1:
        a2d, sd = A.reshape(-1, A.shape[-1]), 1
    else:
        a2d, sd = A.movedim(scatter_dim, 0).reshape(-1, A.shape[-1]), 0
    if torch.compiler.is_compiling():  # traced BSP, or the custom op with its autograd registration
        out = compiled_call("gemm_rs", a2d, B, sd, group)[0]
    else:
        with calling(
            "fused_matmul_reduce_scatter", f"A {tuple(A.shape)}", f"scatter_dim={scatter_dim}", reduce_op
        ):
            out = runtime_for(group).serve("function", "gemm_rs", (a2d, B), {"scatter_dim": sd})[0]
    ws = a2d.shape[0] // out.shape[0] if sd == 0 else B.shape[1] // out.shape[1]
    if reduce_op == "avg":
        out = out / ws
    if sd == 1:
        return out.reshape(*A.shape[:-1], out.shape[-1])
    moved = list(A.movedim(scatter_dim, 0).shape)
    moved[0] //= ws
    return out.reshape(*moved[:-1], out.shape[-1]).movedim(0, scatter_dim)


def _arguments_error(A: Any, B: Any, reduce_op: Any, scatter_dim: Any) -> str | None:
    """Why these are not :func:`fused_matmul_reduce_scatter`'s arguments (``None`` when they are)."""
    from ...runtime.agreement import check_dim

    if reduce_op not in ("sum", "avg"):
        return f"reduce_op: expected 'sum' or 'avg', got {reduce_op!r}"
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            return f"{name}: expected a torch.Tensor, got {type(t).__name__}"
    return check_dim("scatter_dim", scatter_dim, A.dim(), "product")


FORM = {"fused_matmul_reduce_scatter": fused_matmul_reduce_scatter}
