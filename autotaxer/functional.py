"""Drop-in functions with PyTorch's signatures, served by :func:`autotaxer.dispatch`.

Each comes from the op that serves it (its ``functions`` integration, ``autotaxer/ops/<op>/_functional.py``),
found in the op registry on first use: ``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name)``
and ``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)`` have the contracts of
``torch.ops.symm_mem``'s ops of those names. The helpers below are what such functions share.
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


def function_names() -> list[str]:
    """The functions the registered ops provide here."""
    from .ops import ops_with

    return sorted(name for op in ops_with("functions") for name in op.function_names)


def __getattr__(name: str) -> Any:
    from .ops import ops_with

    for op in ops_with("functions"):
        if name in op.function_names:
            value = op.integration("functions")[name]
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *function_names()})
