"""torch's own fused symmetric-memory ops, reached without going through the dispatcher.

``torch.ops.symm_mem.fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` are registered in
Python by ``torch.distributed._symmetric_memory`` (its CUDA kernels are the functions
``_fused_all_gather_matmul`` and ``_fused_matmul_reduce_scatter``). autotaxer calls those functions
directly where they exist, so that a kernel override of the ops (``autotaxer.async_tp``) never calls
back into itself; on a torch without them it calls the ops.
"""

from __future__ import annotations

from typing import Any


def unavailable_reason() -> str | None:
    """Why torch's fused symmetric-memory ops cannot run in this process (None when they can)."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return "needs NVIDIA GPUs"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (registers the ops)
    except ImportError:
        return f"torch {torch.__version__} has no symmetric memory"
    if not hasattr(torch.ops.symm_mem, "fused_all_gather_matmul"):
        return f"torch {torch.__version__} has no symm_mem.fused_all_gather_matmul"
    return None


def originals_reason() -> str | None:
    """Why torch's fused ops cannot be reached as Python functions here (None when both can), i.e. why a
    kernel override of the ops could not fall back to them without calling itself."""
    import torch

    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return f"torch {torch.__version__} has no torch.distributed._symmetric_memory"
    for name in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter"):
        if not hasattr(torch.ops.symm_mem, name):
            return f"torch {torch.__version__} has no torch.ops.symm_mem.{name}"
        if not callable(getattr(symm_mem, f"_{name}", None)):
            return (
                f"torch {torch.__version__} has no Python kernel torch.distributed._symmetric_memory._{name}"
            )
    return None


def _original(name: str) -> Any:
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    fn = getattr(symm_mem, f"_{name}", None)
    return fn if callable(fn) else getattr(torch.ops.symm_mem, name)


def all_gather_matmul(
    a_shard: Any, bs: list[Any], gather_dim: int, group_name: str, *, return_A: bool = True
) -> tuple[Any, list[Any]]:
    """torch's ``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A=...)``."""
    return _original("fused_all_gather_matmul")(a_shard, bs, gather_dim, group_name, return_A=return_A)


def matmul_reduce_scatter(a: Any, b: Any, reduce_op: str, scatter_dim: int, group_name: str) -> Any:
    """torch's ``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)``."""
    return _original("fused_matmul_reduce_scatter")(a, b, reduce_op, scatter_dim, group_name)
