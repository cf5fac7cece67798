"""``fused_all_gather_matmul``: ``torch.ops.symm_mem.fused_all_gather_matmul``'s contract, served by
dispatch (:mod:`autotaxer.functional` exports it).

All-gather ``A_shard`` along ``gather_dim`` over the group, return the gathered A and ``A @ B`` for each
B, so code written for PyTorch's async-TP swaps one call. The first B is one tuned ``ag_gemm`` problem;
the others multiply the gathered A, so all of them share one all-gather. The key's winner serves the call
whatever it can hand out unless the gathered A is needed (``return_A``, several Bs, or the first B
requires grad): then a winner that cannot return it is replaced by the fastest form that can.
Differentiable in A_shard, every B and the returned A.
"""

from __future__ import annotations

from typing import Any

import torch

from ...functional import _from_matrix, _group_arg, _to_matrix


def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group_name: Any = None,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``(all_gather(A_shard, gather_dim), [A @ B for B in Bs])`` over the group; collective.

    ``group_name``: a process group's name (PyTorch's signature), the group itself, or None for the
    default group. Each B is ``(K, N_i)``: row-major, or an nn.Linear weight passed as ``weight.t()``.
    """
    from ...runtime.agreement import calling, refuse
    from ...runtime.dispatch import runtime_for

    group = _group_arg(group_name)
    error = _arguments_error(A_shard, Bs, gather_dim)
    if error is not None:  # told to every rank: each raises, none waits for this one
        refuse("ag_gemm", group, ValueError(f"fused_all_gather_matmul: {error}"))
    gather_dim %= A_shard.dim()
    a2d, gd = _to_matrix(A_shard, gather_dim)
    keep = return_A or len(Bs) > 1  # the caller uses the gathered A
    if torch.compiler.is_compiling():  # traced BSP, or a custom op with its autograd registration
        from ...runtime.custom_op import compiled_call

        first, gathered = compiled_call("ag_gemm", a2d, Bs[0], gd, group, keep)
    else:
        rt = runtime_for(group)
        with calling(
            "fused_all_gather_matmul", f"A_shard {tuple(A_shard.shape)}", f"gather_dim={gather_dim}"
        ):
            first, gathered = rt.serve("function", "ag_gemm", (a2d, Bs[0]), {"gather_dim": gd}, keep)
    outs = [first] + [gathered @ b for b in Bs[1:]]
    ws = first.shape[0] // a2d.shape[0] if gd == 0 else Bs[0].shape[0] // a2d.shape[1]
    outs = [_from_matrix(o, A_shard, gather_dim, ws) for o in outs]
    return (_from_matrix(gathered, A_shard, gather_dim, ws) if return_A else None), outs


def _arguments_error(A_shard: Any, Bs: Any, gather_dim: Any) -> str | None:
    """Why these are not :func:`fused_all_gather_matmul`'s arguments (``None`` when they are)."""
    from ...runtime.agreement import check_dim

    if not isinstance(A_shard, torch.Tensor):
        return f"A_shard: expected a torch.Tensor, got {type(A_shard).__name__}"
    if not isinstance(Bs, (list, tuple)) or not Bs:
        return "Bs: at least one B is needed"
    for i, b in enumerate(Bs):
        if not isinstance(b, torch.Tensor):
            return f"Bs[{i}]: expected a torch.Tensor, got {type(b).__name__}"
    return check_dim("gather_dim", gather_dim, A_shard.dim(), "A_shard")


FORM = {"fused_all_gather_matmul": fused_all_gather_matmul}
