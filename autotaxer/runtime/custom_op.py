"""``autotaxer::ag_gemm``: dispatch as a torch custom op, so ``torch.compile`` can trace it.

Inside a compiled region :func:`autotaxer.dispatch` calls this op. The tracer only sees the fake
implementation (the output's shape and dtype); at run time the real implementation is the ordinary
eager dispatch (table lookup + the tuned variant). Process groups cross the op boundary by name:
``""`` is the default group, other groups are registered by :func:`group_name`.

    torch.ops.autotaxer.ag_gemm(a_shard, b, gather_dim, group_name) -> Tensor (M, N)
    torch.ops.autotaxer.ag_gemm_saving(a_shard, b, gather_dim, group_name) -> (C, gathered A)
    torch.ops.autotaxer.reduce_scatter_grad(full, gather_dim, group_name) -> Tensor
    torch.ops.autotaxer.gemm_rs(a, b, scatter_dim, group_name) -> Tensor (its slice of sum_r a_r b_r)

``ag_gemm_saving`` is what a compiled region calls when an input requires grad: it has an autograd
registration (:mod:`.autograd`'s backward, its reduce-scatter the opaque op ``reduce_scatter_grad``),
so ``torch.compile`` traces forward and backward around the two opaque communicating calls.
"""

from __future__ import annotations

from typing import Any

import torch

from ._runtimes import runtime_for

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
    return runtime_for(_resolve(group_name)).dispatch("ag_gemm", a_shard, b, gather_dim=gather_dim)


def _gathered_shape(a_shard: torch.Tensor, gather_dim: int, group_name: str) -> tuple[int, int]:
    ws = _world_size(group_name)
    if gather_dim == 0:
        return a_shard.shape[0] * ws, a_shard.shape[1]
    return a_shard.shape[0], a_shard.shape[1] * ws


@ag_gemm.register_fake
def _ag_gemm_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    m, _ = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1]))


@torch.library.custom_op("autotaxer::ag_gemm_saving", mutates_args=())
def ag_gemm_saving(
    a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C, gathered A)``: :func:`ag_gemm` that also returns the gathered A it communicated (fresh)."""
    rt = runtime_for(_resolve(group_name))
    with torch.no_grad():
        return rt.dispatch_saving("ag_gemm", a_shard, b, gather_dim=gather_dim)


@ag_gemm_saving.register_fake
def _ag_gemm_saving_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str):
    m, k = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1])), a_shard.new_empty((m, k))


@torch.library.custom_op("autotaxer::reduce_scatter_grad", mutates_args=())
def reduce_scatter_grad(full: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    """This rank's shard of the sum over ranks of ``full`` along ``gather_dim``."""
    from .autograd import reduce_scatter_grad as _reduce_scatter

    out = _reduce_scatter(full, gather_dim, _resolve(group_name), _world_size(group_name))
    return out.clone() if out is full else out  # a custom op never returns its input


@reduce_scatter_grad.register_fake
def _reduce_scatter_grad_fake(full: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    ws = _world_size(group_name)
    m, k = full.shape
    return full.new_empty((m // ws, k) if gather_dim == 0 else (m, k // ws))


def _saving_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    a_shard, b, gather_dim, group_name = inputs
    ctx.save_for_backward(output[1], b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _saving_backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
    from .autograd import ag_gemm_grads

    gathered, b = ctx.saved_tensors

    def reduce_scatter(full: torch.Tensor) -> torch.Tensor:
        return torch.ops.autotaxer.reduce_scatter_grad(full, ctx.gather_dim, ctx.group_name)

    needs = ctx.needs_input_grad[:2]
    return (*ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, reduce_scatter), None, None)


ag_gemm_saving.register_autograd(_saving_backward, setup_context=_saving_setup)


@torch.library.custom_op("autotaxer::gemm_rs", mutates_args=())
def gemm_rs(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of the sum over ranks of ``a @ b`` (tuned variant)."""
    rt = runtime_for(_resolve(group_name))
    with torch.no_grad():
        return rt.dispatch("gemm_rs", a, b, scatter_dim=scatter_dim)


@gemm_rs.register_fake
def _gemm_rs_fake(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    ws = _world_size(group_name)
    m, n = a.shape[0], b.shape[1]
    return a.new_empty((m // ws, n) if scatter_dim == 0 else (m, n // ws))


def _gemm_rs_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b, scatter_dim, group_name = inputs
    ctx.save_for_backward(a, b)
    ctx.scatter_dim, ctx.group_name = scatter_dim, group_name


def _gemm_rs_backward(ctx: Any, grad_out: torch.Tensor):
    """One tuned ``ag_gemm`` of ``grad_out`` with ``bᵀ``; it also returns the gathered ``grad_out``."""
    from .autograd import weight_grad

    a, b = ctx.saved_tensors
    grad_a, gathered = torch.ops.autotaxer.ag_gemm_saving(
        grad_out.contiguous(), b.t(), ctx.scatter_dim, ctx.group_name
    )
    grad_b = weight_grad(a, gathered, b) if ctx.needs_input_grad[1] else None
    return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None


gemm_rs.register_autograd(_gemm_rs_backward, setup_context=_gemm_rs_setup)

#: Ops with a custom op for torch.compile: name -> (its layout field, default).
_COMPILED = {"ag_gemm": "gather_dim", "gemm_rs": "scatter_dim"}


def compiled_dispatch(op: str, tensors: tuple, out: Any, layout: dict[str, int], group: Any) -> Any:
    """What :func:`autotaxer.dispatch` does while ``torch.compile`` traces: call the op's custom op."""
    if op not in _COMPILED:
        raise NotImplementedError(
            f"dispatch({op!r}) inside torch.compile: custom ops exist for {sorted(_COMPILED)}"
        )
    field = _COMPILED[op]
    for name in layout:
        if name != field:
            raise ValueError(f"{name}: not a layout field of {op} (known: {field})")
    a, b = tensors
    dim, name = int(layout.get(field, 0)), group_name(group)
    grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    if grad and out is not None:
        raise RuntimeError("dispatch(out=...): an output buffer cannot be differentiated through")
    if op == "gemm_rs":
        result = torch.ops.autotaxer.gemm_rs(a, b, dim, name)
    elif grad:
        return torch.ops.autotaxer.ag_gemm_saving(a, b, dim, name)[0]
    else:
        result = torch.ops.autotaxer.ag_gemm(a, b, dim, name)
    if out is not None:
        out.copy_(result)
        return out
    return result
