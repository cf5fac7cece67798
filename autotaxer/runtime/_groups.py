"""Process groups across the boundary of a custom op, and PyTorch's differentiable functional collectives.

A group crosses a torch custom op's signature by name: ``""`` is the default group, others their
``group_name`` (a group seen by :func:`group_name`, or any name torch can resolve).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .._default_group import release_default_group

#: group name -> ProcessGroup, filled by group_name(); weak, so destroy_process_group can end a group
_GROUPS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
release_default_group()  # before this package's custom ops import torch._dynamo, which pins WORLD


def group_name(group: Any) -> str:
    """The name that stands for ``group`` in a custom op's signature (``""`` for the default group); a
    name is returned as it is."""
    if group is None or isinstance(group, str):
        return group or ""
    name = group.group_name
    if not torch.compiler.is_compiling():
        _GROUPS[name] = group
    return name


def resolve(name: str) -> Any:
    """The process group of ``name``: None for the default group (the key dispatch's runtimes use)."""
    if name == "":
        return None
    group = _GROUPS.get(name)
    if group is None:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _resolve_process_group

        try:
            group = _resolve_process_group(name)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ValueError(f"group_name: unknown process group {name!r} ({exc})") from None
        if group is dist.group.WORLD:
            return None
        _GROUPS[name] = group
    return group


def collective_name(name: str) -> str:
    """The name functional collectives take for the group ``name`` stands for."""
    if name:
        return name
    import torch.distributed as dist

    return dist.group.WORLD.group_name


def world_size(name: str) -> int:
    """Ranks of the group ``name`` stands for (1 without torch.distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(resolve(name))
    return 1


def functional_collective(name: str) -> Any:
    """PyTorch's functional collective ``name`` (``all_gather`` / ``reduce_scatter``) of one tensor,
    differentiable: ``*_single_autograd`` where torch has it, ``*_tensor_autograd`` before."""
    import torch.distributed._functional_collectives as funcol

    return getattr(funcol, f"{name}_single_autograd", None) or getattr(funcol, f"{name}_tensor_autograd")
