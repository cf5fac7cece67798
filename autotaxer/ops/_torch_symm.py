"""torch's own fused symmetric-memory ops, reached without going through the dispatcher.

``torch.ops.symm_mem.fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter`` are registered in
Python by ``torch.distributed._symmetric_memory`` (its CUDA kernels are the functions
``_fused_all_gather_matmul`` and ``_fused_matmul_reduce_scatter``). autotaxer calls those functions
directly where they exist, so that a kernel override of the ops (``autotaxer.async_tp``) never calls
back into itself; on a torch without them it calls the ops.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .._problem import ProblemKey, Target
from ._base import Params, RunContext, Workspace


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
    """torch's ``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A=...)``; the group's
    workspace it ran against is kept alive (:func:`hold_workspace`)."""
    out = _original("fused_all_gather_matmul")(a_shard, bs, gather_dim, group_name, return_A=return_A)
    hold_workspace(group_name)
    return out


def matmul_reduce_scatter(a: Any, b: Any, reduce_op: str, scatter_dim: int, group_name: str) -> Any:
    """torch's ``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)``; the group's
    workspace it ran against is kept alive (:func:`hold_workspace`)."""
    out = _original("fused_matmul_reduce_scatter")(a, b, reduce_op, scatter_dim, group_name)
    hold_workspace(group_name)
    return out


def group_name_of(ctx: RunContext) -> str:
    """The name torch's ops take for the run context's group."""
    import torch.distributed as dist

    return (ctx.group or dist.group.WORLD).group_name


class TorchFusedForm:
    """Mixin of the ``torch_fused`` variant of each op: torch's own fused op, one fixed algorithm (its
    micro-pipelined all-gather or reduce-scatter over symmetric memory, one chunk a peer), timed, stored
    and served like every variant. It has no parameters: per call torch lets a caller choose only what
    the problem key already fixes (``gather_dim``/``scatter_dim``, ``reduce_op``) and ``return_A``,
    which :meth:`run` turns off and ``run_for_backward`` on. A form users have without autotaxer, so an
    untuned key may be served it (``fallback_form``). Needs torch's CUDA symmetric-memory backend
    (:mod:`._symm_backend`)."""

    name: ClassVar[str] = "torch_fused"
    device_types: ClassVar[frozenset[str]] = frozenset({"cuda"})
    fallback_form: ClassVar[bool] = True

    def unavailable_reason(self, target: Target) -> str | None:
        from ._symm_backend import conflict

        reason = super().unavailable_reason(target)  # type: ignore[misc]
        if reason is None and not target.is_nvidia:
            reason = f"torch's fused symmetric-memory ops run on NVIDIA GPUs, not {target.gpu_model}"
        return reason or unavailable_reason() or conflict("cuda")

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch
        import torch.distributed._symmetric_memory as symm_mem

        name = group_name_of(ctx)
        if torch.__version__ < "2.10" and hasattr(symm_mem, "enable_symm_mem_for_group"):  # later: implied
            symm_mem.enable_symm_mem_for_group(name)
        reserve_workspace(name, workspace_bytes(key))
        return Workspace(key, dict(params), {"group_name": name})


#: torch's group workspaces that a larger one replaced or that one of torch's fused ops ran against (this
#: process), each once: a CUDA graph captured while one was current still addresses it, and torch drops
#: its last reference when it grows the workspace, so a replay after the growth read freed memory. An
#: illegal address on 4xH200, 2026-11-28 (the in-step check of a ``gemm_rs`` key replayed a step captured
#: with ``torch_fused`` at a smaller ``ag_gemm`` key: kept since when autotaxer grows it) and on 2xH200,
#: 2026-11-30 (PyTorch's async TP grew it, at a larger key, between replays of ``torch_fused`` calls that
#: autotaxer had captured: kept since by :func:`hold_workspace`). A few tensors: torch grows it rarely,
#: autotaxer to powers of two.
RETIRED_WORKSPACES: list[Any] = []


def _keep(tensor: Any) -> None:
    if not any(t is tensor for t in RETIRED_WORKSPACES):
        RETIRED_WORKSPACES.append(tensor)


def hold_workspace(group_name: str) -> None:
    """Keep the group's current workspace alive for this process's lifetime, as a CUDA graph that captured
    one of torch's fused ops still addresses it after anyone (PyTorch's async TP, torch's op at a larger
    key) grows it; after each call of the ops (a few hundred nanoseconds: the workspace is the last one
    held on nearly every call)."""
    import torch.distributed._symmetric_memory as symm_mem

    held = getattr(symm_mem, "_group_name_to_workspace_tensor", None)
    current = held.get(group_name) if held is not None else None
    if current is not None and (not RETIRED_WORKSPACES or RETIRED_WORKSPACES[-1] is not current):
        _keep(current)


def workspace_bytes(key: ProblemKey) -> int:
    """Bytes torch's fused op of ``key`` asks of its group's symmetric workspace: the local shard of A
    (``ag_gemm``: its pipelined all-gather), two chunks of the output (``gemm_rs``: its pipelined
    reduce-scatter)."""
    from .._problem import torch_dtype

    elt = torch_dtype(key.dtype).itemsize
    shape = dict(key.shape)
    if key.op == "gemm_rs":
        return 2 * shape["M"] * shape["N"] // key.world_size * elt
    return shape["M"] * shape["K"] // key.world_size * elt


def reserve_workspace(group_name: str, nbytes: int) -> None:
    """Grow torch's symmetric workspace of ``group_name`` to at least ``nbytes`` (rounded up to a power of
    two, so a model's keys grow it a few times at most) now, at a workspace's preparation, and keep the
    one it replaces alive in :data:`RETIRED_WORKSPACES`; collective (every rank prepares the same key).
    Nothing while a CUDA graph is being captured (torch's op then raises its own message) or on a torch
    without the workspace registry."""
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    held = getattr(symm_mem, "_group_name_to_workspace_tensor", None)
    if held is None or not hasattr(symm_mem, "get_symm_mem_workspace") or nbytes <= 0:
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    current = held.get(group_name)
    if current is not None and current.numel() * current.element_size() >= nbytes:
        return
    if current is not None:
        _keep(current)
    symm_mem.get_symm_mem_workspace(group_name, min_size=1 << (nbytes - 1).bit_length())


def symm_group_name() -> str:
    """The default group's name, with symmetric memory enabled for it where this torch needs that
    (before 2.10; later it is implied): what torch's fused ops take as ``group_name``."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group") and torch.__version__ < "2.10":
        symm_mem.enable_symm_mem_for_group(group_name)
    return group_name
