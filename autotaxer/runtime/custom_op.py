"""``autotaxer::ag_gemm``: dispatch as a torch custom op, so ``torch.compile`` can trace it.

Inside a compiled region :func:`autotaxer.dispatch` (and every function and layer built on it) becomes
one of two things, chosen while the graph is traced from the call's static sizes, strides and dtype (the
decision the first eager call of that shape would make, agreed by every rank):

* where dispatch serves the plain BSP form (``bsp``), the graph holds what plain PyTorch would: the
  functional collective (``all_gather_tensor`` / ``reduce_scatter_tensor``, differentiable) and the
  matmul, so inductor fuses, schedules and overlaps around them exactly as it does for ``F.linear``
  after a collective, and the compiled layer runs as fast as the compiled plain one;
* anywhere else (a fused variant, another BSP form, or sizes that are symbolic under dynamic shapes) the
  custom op below, opaque to the compiler: its fake implementation gives the output's shape to the
  tracer, and at run time it is the ordinary eager dispatch (table lookup + the tuned variant).

Process groups cross the op boundary by name: ``""`` is the default group, others by their
``group_name`` (a registered group, or any name torch can resolve).

    torch.ops.autotaxer.ag_gemm(a_shard, b, gather_dim, group_name) -> Tensor (M, N)
    torch.ops.autotaxer.ag_gemm_saving(a_shard, b, gather_dim, group_name) -> (C, gathered A)
    torch.ops.autotaxer.gemm_rs(a, b, scatter_dim, group_name) -> Tensor (its slice of sum_r a_r b_r)

``ag_gemm_saving`` is what a compiled region calls when an input requires grad: it has an autograd
registration whose reduce-scatter is a functional collective (traced, so inductor overlaps it with the
weight gradient as it does for plain PyTorch), so ``torch.compile`` traces forward and backward around
the opaque communicating forward.
"""

from __future__ import annotations

from typing import Any

import torch

from ._runtimes import runtime_for

_GROUPS: dict[str, Any] = {}  # group name -> ProcessGroup, filled by group_name()


def group_name(group: Any) -> str:
    """The name that stands for ``group`` in the op's signature (``""`` for the default group); a name
    is returned as it is."""
    if group is None or isinstance(group, str):
        return group or ""
    name = group.group_name
    if not torch.compiler.is_compiling():
        _GROUPS[name] = group
    return name


def _resolve(name: str) -> Any:
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


def _collective_name(name: str) -> str:
    """The name functional collectives take for the group ``name`` stands for."""
    if name:
        return name
    import torch.distributed as dist

    return dist.group.WORLD.group_name


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


def _saving_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    a_shard, b, gather_dim, group_name = inputs
    ctx.save_for_backward(output[1], b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _saving_backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
    from .autograd import ag_gemm_grads

    gathered, b = ctx.saved_tensors

    def reduce_scatter(full: torch.Tensor) -> tuple[torch.Tensor, None]:
        if _world_size(ctx.group_name) == 1:
            return full, None
        group = _collective_name(ctx.group_name)
        return functional_collective("reduce_scatter")(full.contiguous(), "sum", ctx.gather_dim, group), None

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

#: Ops with a custom op for torch.compile: name -> its layout field.
_COMPILED = {"ag_gemm": "gather_dim", "gemm_rs": "scatter_dim"}


def functional_collective(name: str) -> Any:
    """PyTorch's functional collective ``name`` (``all_gather`` / ``reduce_scatter``) of one tensor,
    differentiable: ``*_single_autograd`` where torch has it, ``*_tensor_autograd`` before."""
    import torch.distributed._functional_collectives as funcol

    return getattr(funcol, f"{name}_single_autograd", None) or getattr(funcol, f"{name}_tensor_autograd")


@torch._dynamo.assume_constant_result
def _traced_variant(
    op: str, name: str, dim: int, a0: int, a1: int, as0: int, as1: int, b0: int, b1: int, bs0: int,
    bs1: int, dtype: torch.dtype, device: torch.device,
) -> str:  # fmt: skip
    """The variant dispatch serves a call of these static sizes, strides and dtype; run while tracing
    (collective: every rank traces the same call)."""
    a = torch.empty_strided((a0, a1), (as0, as1), dtype=dtype, device="meta")
    b = torch.empty_strided((b0, b1), (bs0, bs1), dtype=dtype, device="meta")
    rt = runtime_for(_resolve(name))
    return rt.decide_call(op, (a, b), {_COMPILED[op]: dim}, device).variant


def _served_as_bsp(op: str, a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> bool:
    """True when dispatch serves ``bsp`` for this call and its sizes are static (decided while tracing)."""
    from torch.fx.experimental.symbolic_shapes import has_static_value

    dims = (*a.shape, *a.stride(), *b.shape, *b.stride())
    if not all(has_static_value(d) for d in dims):
        return False  # dynamic shapes: the custom op decides per call at run time
    return _traced_variant(op, name, dim, *dims[:4], *dims[4:], a.dtype, a.device) == "bsp"


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as plain PyTorch writes it: ``F.linear(a, weight)`` where ``b`` is an nn.Linear weight's
    ``weight.t()``, so autograd computes the weight's gradient in the weight's own layout (through
    ``matmul`` it is made transposed and copied: 4% of a compiled training step on 2xH200)."""
    from ..ops._matmul import b_layout_of

    if b_layout_of(b) == "nk":
        return torch.nn.functional.linear(a, b.t())
    return torch.matmul(a, b)


def _bsp_graph(op: str, a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, Any]:
    """BSP as plain PyTorch writes it, traceable and differentiable: ``(output, gathered A or None)``."""
    group = _collective_name(name)
    if op == "ag_gemm":
        gathered = functional_collective("all_gather")(a.contiguous(), dim, group)
        return _product(gathered, b), gathered
    return functional_collective("reduce_scatter")(_product(a, b), "sum", dim, group), None


def compiled_saving(a: torch.Tensor, b: torch.Tensor, gather_dim: int, group: Any) -> tuple[Any, Any]:
    """``(C, gathered A)`` of an ``ag_gemm`` while ``torch.compile`` traces (see the module docstring)."""
    name = group_name(group)
    if _served_as_bsp("ag_gemm", a, b, gather_dim, name):
        return _bsp_graph("ag_gemm", a, b, gather_dim, name)
    return torch.ops.autotaxer.ag_gemm_saving(a, b, gather_dim, name)


def compiled_dispatch(op: str, tensors: tuple, out: Any, layout: dict[str, int], group: Any) -> Any:
    """What :func:`autotaxer.dispatch` does while ``torch.compile`` traces (see the module docstring)."""
    if op not in _COMPILED:
        raise NotImplementedError(
            f"dispatch({op!r}) inside torch.compile: custom ops exist for {sorted(_COMPILED)}"
        )
    field = _COMPILED[op]
    for key in layout:
        if key != field:
            raise ValueError(f"{key}: not a layout field of {op} (known: {field})")
    a, b = tensors
    dim, name = int(layout.get(field, 0)), group_name(group)
    grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    if grad and out is not None:
        raise RuntimeError("dispatch(out=...): an output buffer cannot be differentiated through")
    if _served_as_bsp(op, a, b, dim, name):
        result = _bsp_graph(op, a, b, dim, name)[0]
    elif op == "gemm_rs":
        result = torch.ops.autotaxer.gemm_rs(a, b, dim, name)
    elif grad:
        return torch.ops.autotaxer.ag_gemm_saving(a, b, dim, name)[0]
    else:
        result = torch.ops.autotaxer.ag_gemm(a, b, dim, name)
    if out is not None:
        out.copy_(result)
        return out
    return result
