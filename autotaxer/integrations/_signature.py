"""What the calls with PyTorch's signatures share (the functions of :mod:`autotaxer.functional`, the
async-TP override, the layers): a process group from what a caller passes, an argument error raised on
every rank, and N-D tensors as the 2-D problems of the ops."""

from __future__ import annotations

from typing import Any, NoReturn

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


def group_world_size(group: Any) -> int:
    """The number of ranks of ``group`` (1 without ``torch.distributed``)."""
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def group_arg(group_name: Any) -> Any:
    """What dispatch takes for ``group_name``: while ``torch.compile`` traces, a name is passed on as it
    is (resolved by the custom op at run time: resolving it here would break the graph)."""
    if isinstance(group_name, str) and torch.compiler.is_compiling():
        return group_name
    return resolve_group(group_name)


def to_matrix(a_shard: torch.Tensor, gather_dim: int) -> tuple[torch.Tensor, int]:
    """``a_shard`` as the 2-D shard of an ``ag_gemm`` and that op's gather_dim (0: rows, 1: K)."""
    if gather_dim == a_shard.dim() - 1:
        return a_shard.reshape(-1, a_shard.shape[-1]), 1
    return a_shard.movedim(gather_dim, 0).reshape(-1, a_shard.shape[-1]), 0


def from_matrix(x: torch.Tensor, a_shard: torch.Tensor, gather_dim: int, ws: int) -> torch.Tensor:
    """Undo :func:`to_matrix` for a gathered ``(rows, cols)`` result (last dim ``cols``)."""
    if gather_dim == a_shard.dim() - 1:
        return x.reshape(*a_shard.shape[:-1], x.shape[-1])
    moved = list(a_shard.movedim(gather_dim, 0).shape)
    moved[0] *= ws
    return x.reshape(*moved[:-1], x.shape[-1]).movedim(0, gather_dim)


def refuse(op: str, group: Any, error: Exception) -> NoReturn:
    """Raise ``error`` (a wrapper's argument check of ``op``) on every rank of ``group``; collective
    where peers wait (:mod:`autotaxer.runtime.agreement`)."""
    import torch.distributed as dist

    from ..runtime.dispatch import runtime_for

    if torch.compiler.is_compiling():  # a trace: every rank traces the same code and raises alike
        raise error
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        raise error
    runtime_for(group)._refuse(op, error)
    raise error  # _refuse raises; this line keeps the type checker's NoReturn honest
