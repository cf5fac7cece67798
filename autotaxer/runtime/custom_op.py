"""``autotaxer::ag_gemm``: dispatch as a torch custom op, so ``torch.compile`` can trace it.

Inside a compiled region :func:`autotaxer.dispatch` calls this op. The tracer only sees the fake
implementation (the output's shape and dtype); at run time the real implementation is the ordinary
eager dispatch (table lookup + the tuned variant). Process groups cross the op boundary by name:
``""`` is the default group, other groups are registered by :func:`group_name`.

    torch.ops.autotaxer.ag_gemm(a_shard, b, gather_dim, group_name) -> Tensor (M, N)
"""

from __future__ import annotations

from typing import Any

import torch

_GROUPS: dict[str, Any] = {}  # group name -> ProcessGroup, filled by group_name()


def group_name(group: Any) -> str:
    """The name that stands for ``group`` in the op's signature (``""`` for the default group)."""
    if group is None:
        return ""
    name = group.group_name
    _GROUPS[name] = group
    return name


def _resolve(name: str) -> Any:
    if name == "":
        return None
    if name not in _GROUPS:
        raise ValueError(f"group_name: unknown process group {name!r} (pass the group to dispatch first)")
    return _GROUPS[name]


def _world_size(name: str) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(_resolve(name))
    return 1


@torch.library.custom_op("autotaxer::ag_gemm", mutates_args=())
def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    """All-gather ``a_shard`` along ``gather_dim`` over the group, then multiply by ``b`` (tuned variant)."""
    from .dispatch import dispatch

    return dispatch("ag_gemm", a_shard, b, gather_dim=gather_dim, group=_resolve(group_name))


@ag_gemm.register_fake
def _ag_gemm_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    ws = _world_size(group_name)
    m = a_shard.shape[0] * ws if gather_dim == 0 else a_shard.shape[0]
    return a_shard.new_empty((m, b.shape[1]))


def compiled_dispatch(op: str, tensors: tuple, out: Any, layout: dict[str, int], group: Any) -> Any:
    """What :func:`autotaxer.dispatch` does while ``torch.compile`` traces: call the custom op."""
    if op != "ag_gemm":
        raise NotImplementedError(f"dispatch({op!r}) inside torch.compile: only 'ag_gemm' is a custom op")
    for name in layout:
        if name != "gather_dim":
            raise ValueError(f"{name}: not a layout field of ag_gemm (known: gather_dim)")
    a_shard, b = tensors
    result = torch.ops.autotaxer.ag_gemm(a_shard, b, int(layout.get("gather_dim", 0)), group_name(group))
    if out is not None:
        out.copy_(result)
        return out
    return result
