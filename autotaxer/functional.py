"""Drop-in functions with PyTorch's signatures, served by :func:`autotaxer.dispatch`.

``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)`` is
``torch.ops.symm_mem.fused_matmul_reduce_scatter``'s contract: ``A @ B`` on every rank, summed (or
averaged) over the group and scattered along ``scatter_dim`` of the product, as one tuned ``gemm_rs``.

``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name)`` is
``torch.ops.symm_mem.fused_all_gather_matmul``'s contract: all-gather ``A_shard`` along ``gather_dim``
over the group, return the gathered A and ``A @ B`` for each B, so code written for PyTorch's async-TP
swaps one call. The first B is one tuned ``ag_gemm`` problem (whose variant also returns the gathered A
it communicated); the others multiply that gathered A, so all of them share one all-gather.
Differentiable in A_shard, every B and the returned A.
"""

from __future__ import annotations

from typing import Any

import torch


def resolve_group(group: Any) -> Any:
    """A process group from a group name, a group, or None (the default group, as dispatch keys it)."""
    if group is None or group == "":
        return None
    if isinstance(group, str):
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(group)
        return None if group is dist.group.WORLD else group
    return group


def _world_size(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _group_arg(group_name: Any) -> Any:
    """What dispatch takes for ``group_name``: while ``torch.compile`` traces, a name is passed on as it
    is (resolved by the custom op at run time: resolving it here would break the graph)."""
    if isinstance(group_name, str) and torch.compiler.is_compiling():
        return group_name
    return resolve_group(group_name)


def _to_matrix(a_shard: torch.Tensor, gather_dim: int) -> tuple[torch.Tensor, int]:
    """``a_shard`` as the 2-D shard of an ``ag_gemm`` and that op's gather_dim (0: rows, 1: K)."""
    if gather_dim == a_shard.dim() - 1:
        return a_shard.reshape(-1, a_shard.shape[-1]), 1
    return a_shard.movedim(gather_dim, 0).reshape(-1, a_shard.shape[-1]), 0


def _from_matrix(x: torch.Tensor, a_shard: torch.Tensor, gather_dim: int, ws: int) -> torch.Tensor:
    """Undo :func:`_to_matrix` for a gathered ``(rows, cols)`` result (last dim ``cols``)."""
    if gather_dim == a_shard.dim() - 1:
        return x.reshape(*a_shard.shape[:-1], x.shape[-1])
    moved = list(a_shard.movedim(gather_dim, 0).shape)
    moved[0] *= ws
    return x.reshape(*moved[:-1], x.shape[-1]).movedim(0, gather_dim)


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
    from .runtime.dispatch import runtime_for

    if not Bs:
        raise ValueError("Bs: at least one B is needed")
    if not -A_shard.dim() <= gather_dim < A_shard.dim():
        raise ValueError(f"gather_dim: {gather_dim} is not a dimension of a {A_shard.dim()}-D A_shard")
    gather_dim %= A_shard.dim()
    group = _group_arg(group_name)
    a2d, gd = _to_matrix(A_shard, gather_dim)
    if torch.compiler.is_compiling():  # traced BSP, or the custom op with its autograd registration
        from .runtime.custom_op import compiled_saving

        first, gathered = compiled_saving(a2d, Bs[0], gd, group)
    else:
        rt = runtime_for(group)
        first, gathered = rt.dispatch_saving("ag_gemm", a2d, Bs[0], gather_dim=gd)
    outs = [first] + [gathered @ b for b in Bs[1:]]
    ws = gathered.shape[gd] // a2d.shape[gd]
    outs = [_from_matrix(o, A_shard, gather_dim, ws) for o in outs]
    return (_from_matrix(gathered, A_shard, gather_dim, ws) if return_A else None), outs


def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: Any = None
) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of ``sum over ranks of A @ B`` (``reduce_op`` ``"sum"``
    or ``"avg"``); collective. ``A`` is ``(..., K_r)``, ``B`` ``(K_r, N)`` (row-major or ``weight.t()``).
    """
    from .runtime.dispatch import dispatch

    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"reduce_op: expected 'sum' or 'avg', got {reduce_op!r}")
    out_dims = A.dim()  # the product has A's dims, its last one N
    if not -out_dims <= scatter_dim < out_dims:
        raise ValueError(f"scatter_dim: {scatter_dim} is not a dimension of the {out_dims}-D product")
    scatter_dim %= out_dims
    group = _group_arg(group_name)
    if scatter_dim == out_dims - 1:
        a2d, sd = A.reshape(-1, A.shape[-1]), 1
    else:
        a2d, sd = A.movedim(scatter_dim, 0).reshape(-1, A.shape[-1]), 0
    out = dispatch("gemm_rs", a2d, B, scatter_dim=sd, group=group)
    ws = a2d.shape[0] // out.shape[0] if sd == 0 else B.shape[1] // out.shape[1]
    if reduce_op == "avg":
        out = out / ws
    if sd == 1:
        return out.reshape(*A.shape[:-1], out.shape[-1])
    moved = list(A.movedim(scatter_dim, 0).shape)
    moved[0] //= ws
    return out.reshape(*moved[:-1], out.shape[-1]).movedim(0, scatter_dim)
