"""``ag_gemm``'s integrations (``FORMS``): its autograd, its custom ops under ``torch.compile``,
``fused_all_gather_matmul`` and what ``autotaxer bench`` times in its rows besides BSP, its variants and
dispatch: the all-gather alone and the full GEMM alone (the ceiling of a fused kernel is the slower of
them), PyTorch's ``fused_all_gather_matmul`` (gather_dim=0) and Iris' stock ``all_gather_matmul``
(gather_dim=1, in a process group of its own: it may hang).

Autograd: ``C = all_gather(A_shard, gather_dim) @ B`` on every rank. Forward runs the planned variant.
Where B requires grad (or the caller wants the gathered A) it runs through :meth:`Plan.run_saving`, which
also returns the gathered A it communicated (a fresh tensor, saved for backward: no second all-gather; a
winner that cannot hand it out is replaced, for that call, by the fastest form that can); elsewhere the
winner runs whatever it can save, since A's gradient needs only B. Backward, on every rank:

* ``grad_B = gathered_Aᵀ · grad_C`` (local: each rank's B is its own, e.g. a column shard of a weight);
* ``grad_A_shard = reduce-scatter(grad_C · Bᵀ + grad_gathered)`` along ``gather_dim``: every rank's
  gathered A is the same tensor, so its gradient is the sum over ranks, of which each keeps its shard.
  ``grad_gathered`` is the gradient of the gathered A where the caller used it too
  (:func:`fused_all_gather_matmul` returns it). Where a tuned ``gemm_rs`` (the reduce-scatter op) serves
  ``grad_C · Bᵀ``, it computes and scatters in one.

The reduce-scatter is NCCL's ``reduce_scatter_tensor`` (gloo: an all-reduce and the rank's slice), so a
backward captured in a CUDA graph replays like any NCCL collective.

Under ``torch.compile``::

    torch.ops.autotaxer.ag_gemm(a_shard, b, gather_dim, group_name) -> Tensor (M, N)
    torch.ops.autotaxer.ag_gemm_saving(a_shard, b, gather_dim, group_name) -> (C, gathered A)

``ag_gemm`` is served by the key's winner whatever it can hand out; ``ag_gemm_saving`` is what a compiled
region calls where the gathered A is needed (returned to the caller, or B requires grad). Both have
autograd registrations whose reduce-scatter is a functional collective (traced, so inductor overlaps it
with the weight gradient as it does for plain PyTorch), so ``torch.compile`` traces forward and backward
around the opaque communicating forward. :mod:`.compiled` decides which form a call gets.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from .._problem import ProblemKey, torch_dtype
from ..ops import RunContext, get_op
from ..ops._collectives import all_gather_shards, reduce_scatter_async
from ..ops._forms import AutogradForm, BenchForm, CompiledForm, Peer
from ..ops._matmul import linear_product, weight_grad
from ..ops._torch_symm import symm_group_name
from ..runtime._groups import collective_name, functional_collective, resolve, world_size
from ..runtime.dispatch import runtime_for
from ._library import define
from ._signature import from_matrix, group_arg, refuse, to_matrix
from .autograd import serve

#: The op that computes this op's input gradient (``grad_C · Bᵀ``, reduce-scattered).
BACKWARD_OP = "gemm_rs"


# -- autograd ---------------------------------------------------------------------------------------
def reduce_scatter_grad_async(
    full: torch.Tensor, gather_dim: int, group: Any, world_size: int
) -> tuple[torch.Tensor, Any]:
    """This rank's shard of ``sum over ranks of full`` along ``gather_dim`` (``full`` is ``(M, K)``),
    issued without waiting: ``(shard, work)``; ``work.wait()`` (when not None) before the shard is used,
    so what is queued in between overlaps the collective."""
    if world_size == 1:
        return full, None
    m, k = full.shape
    shape = (m // world_size, k) if gather_dim == 0 else (m, k // world_size)
    return reduce_scatter_async(full, full.new_empty(shape), gather_dim, group)


def ag_gemm_grads(
    needs: tuple[bool, ...],
    grad_out: torch.Tensor | None,
    grad_gathered: torch.Tensor | None,
    gathered: torch.Tensor,
    b: torch.Tensor,
    reduce_scatter: Callable[[torch.Tensor], tuple[torch.Tensor, Any]],
    gemm_rs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(grad_a_shard, grad_b)`` for the inputs in ``needs``: ``reduce_scatter(grad_C · Bᵀ +
    grad_gathered)`` and ``gathered_Aᵀ · grad_C``. ``gemm_rs(grad_C, Bᵀ)`` (a tuned op that computes and
    scatters in one) returns the first, or None where plain BSP serves it; then the product is computed
    here and ``reduce_scatter`` (returning ``(shard, work or None)``) scatters it while ``grad_b`` is
    computed, as PyTorch's functional collectives let autograd do for plain layers."""
    grad_a = grad_b = work = None
    if needs[0] and gemm_rs is not None and grad_gathered is None and grad_out is not None:
        grad_a = gemm_rs(grad_out, b.t())
    if needs[0] and grad_a is None:
        full = grad_out @ b.t() if grad_out is not None else None
        if grad_gathered is not None:
            full = grad_gathered if full is None else full + grad_gathered
        if full is not None:
            grad_a, work = reduce_scatter(full)
    if needs[1] and grad_out is not None:
        grad_b = weight_grad(gathered, grad_out, b)
    if work is not None:
        work.wait()
    return grad_a, grad_b


class AgGemmFunction(torch.autograd.Function):
    """``(C, gathered A) = ag_gemm(a_shard, b)`` through a dispatch plan, differentiable in both inputs."""

    @staticmethod
    def forward(
        ctx: Any, a_shard: torch.Tensor, b: torch.Tensor, plan: Any, path: str, keep: bool
    ) -> tuple[torch.Tensor, Any]:
        weight_grad_needed = ctx.needs_input_grad[1]  # grad_B = gathered Aᵀ · grad_C; grad_A needs only B
        out, gathered = plan.forward((a_shard, b), path, keep or weight_grad_needed)
        ctx.save_for_backward(gathered if weight_grad_needed else None, b)
        ctx.set_materialize_grads(False)  # an unused gathered A has no gradient: no zeros to add
        ctx.gather_dim = plan.key["gather_dim"]
        ctx.group = plan.ctx.group
        ctx.world_size = plan.ctx.world_size
        return out, (gathered if keep else None)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
        gathered, b = ctx.saved_tensors

        def reduce_scatter(full: torch.Tensor) -> tuple[torch.Tensor, Any]:
            return reduce_scatter_grad_async(full, ctx.gather_dim, ctx.group, ctx.world_size)

        def gemm_rs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
            rt = runtime_for(ctx.group)
            x = x.contiguous()
            plan = rt.plan(BACKWARD_OP, x, y, scatter_dim=ctx.gather_dim)
            if plan.decision.variant == "bsp":
                plan.count("backward", "bsp")  # computed and scattered by ag_gemm_grads, overlapping grad_b
                return None
            return serve(rt, "backward", BACKWARD_OP, (x, y), {"scatter_dim": ctx.gather_dim})[0]

        needs = ctx.needs_input_grad[:2]
        grads = ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, reduce_scatter, gemm_rs)
        return (*grads, None, None, None)


def _call(tensors: tuple, plan: Any, path: str, keep: bool) -> tuple[torch.Tensor, Any]:
    return AgGemmFunction.apply(*tensors, plan, path, keep)


# -- torch.compile ----------------------------------------------------------------------------------
def ag_gemm(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    """All-gather ``a_shard`` along ``gather_dim`` over the group, then multiply by ``b`` (tuned variant)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return serve(rt, "compiled", "ag_gemm", (a_shard, b), {"gather_dim": gather_dim})[0]


def _gathered_shape(a_shard: torch.Tensor, gather_dim: int, group_name: str) -> tuple[int, int]:
    ws = world_size(group_name)
    if gather_dim == 0:
        return a_shard.shape[0] * ws, a_shard.shape[1]
    return a_shard.shape[0], a_shard.shape[1] * ws


def _ag_gemm_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str) -> torch.Tensor:
    m, _ = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1]))


def ag_gemm_saving(
    a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C, gathered A)``: :func:`ag_gemm` that also returns the gathered A it communicated (fresh)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return serve(rt, "compiled", "ag_gemm", (a_shard, b), {"gather_dim": gather_dim}, keep=True)


def _ag_gemm_saving_fake(a_shard: torch.Tensor, b: torch.Tensor, gather_dim: int, group_name: str):
    m, k = _gathered_shape(a_shard, gather_dim, group_name)
    return a_shard.new_empty((m, b.shape[1])), a_shard.new_empty((m, k))


_SCHEMA = "(Tensor a_shard, Tensor b, int gather_dim, str group_name)"
define("ag_gemm", f"{_SCHEMA} -> Tensor", ag_gemm, _ag_gemm_fake)
define("ag_gemm_saving", f"{_SCHEMA} -> (Tensor, Tensor)", ag_gemm_saving, _ag_gemm_saving_fake)


def _saving_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    a_shard, b, gather_dim, group_name = inputs
    ctx.save_for_backward(output[1], b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _reduce_scatter(ctx: Any) -> Any:
    """``full -> (this rank's shard of the sum over ranks, None)`` as a functional collective."""

    def reduce_scatter(full: torch.Tensor) -> tuple[torch.Tensor, None]:
        if world_size(ctx.group_name) == 1:
            return full, None
        group = collective_name(ctx.group_name)
        return functional_collective("reduce_scatter")(full.contiguous(), "sum", ctx.gather_dim, group), None

    return reduce_scatter


def _saving_backward(ctx: Any, grad_out: torch.Tensor | None, grad_gathered: torch.Tensor | None):
    gathered, b = ctx.saved_tensors
    needs = ctx.needs_input_grad[:2]
    return (*ag_gemm_grads(needs, grad_out, grad_gathered, gathered, b, _reduce_scatter(ctx)), None, None)


torch.library.register_autograd("autotaxer::ag_gemm_saving", _saving_backward, setup_context=_saving_setup)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a_shard, b, gather_dim, group_name = inputs
    # compiled code calls ag_gemm_saving where B requires grad; a direct call keeps the shard to gather again
    ctx.save_for_backward(a_shard if ctx.needs_input_grad[1] else None, b)
    ctx.gather_dim, ctx.group_name = gather_dim, group_name


def _backward(ctx: Any, grad_out: torch.Tensor | None):
    """A's gradient needs only B; B's (a direct call of the op) the shard gathered again."""
    a_shard, b = ctx.saved_tensors
    gathered = _plain(a_shard, b, ctx.gather_dim, ctx.group_name)[1] if a_shard is not None else None
    needs = ctx.needs_input_grad[:2]
    return (*ag_gemm_grads(needs, grad_out, None, gathered, b, _reduce_scatter(ctx)), None, None)


torch.library.register_autograd("autotaxer::ag_gemm", _backward, setup_context=_setup)


def _plain(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """BSP as plain PyTorch writes it, traceable and differentiable: ``(C, gathered A)``."""
    gathered = functional_collective("all_gather")(a.contiguous(), dim, collective_name(name))
    return linear_product(gathered, b), gathered


def _opaque(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    return torch.ops.autotaxer.ag_gemm(a, b, dim, name)


def _backward_keeps(a: torch.Tensor, b: torch.Tensor) -> bool:
    return b.requires_grad  # grad_B = gathered Aᵀ · grad_C; grad_A needs only B


def _saving(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.autotaxer.ag_gemm_saving(a, b, dim, name)


# -- fused_all_gather_matmul ------------------------------------------------------------------------
def fused_all_gather_matmul(
    A_shard: torch.Tensor,
    Bs: list[torch.Tensor],
    gather_dim: int,
    group_name: Any = None,
    *,
    return_A: bool = True,
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``(all_gather(A_shard, gather_dim), [A @ B for B in Bs])`` over the group; collective:
    ``torch.ops.symm_mem.fused_all_gather_matmul``'s contract, served by dispatch.

    ``group_name``: a process group's name (PyTorch's signature), the group itself, or None for the
    default group. Each B is ``(K, N_i)``: row-major, or an nn.Linear weight passed as ``weight.t()``. The
    first B is one tuned ``ag_gemm`` problem; the others multiply the gathered A, so all of them share
    one all-gather. The key's winner serves the call whatever it can hand out unless the gathered A is
    needed (``return_A``, several Bs, or the first B requires grad): then a winner that cannot return it
    is replaced by the fastest form that can. Differentiable in A_shard, every B and the returned A.
    """
    from ..runtime.agreement import calling

    group = group_arg(group_name)
    error = _arguments_error(A_shard, Bs, gather_dim)
    if error is not None:  # told to every rank: each raises, none waits for this one
        refuse("ag_gemm", group, ValueError(f"fused_all_gather_matmul: {error}"))
    gather_dim %= A_shard.dim()
    a2d, gd = to_matrix(A_shard, gather_dim)
    keep = return_A or len(Bs) > 1  # the caller uses the gathered A
    if torch.compiler.is_compiling():  # traced BSP, or a custom op with its autograd registration
        from .compiled import compiled_call

        first, gathered = compiled_call("ag_gemm", a2d, Bs[0], gd, group, keep)
    else:
        rt = runtime_for(group)
        with calling(
            "fused_all_gather_matmul", f"A_shard {tuple(A_shard.shape)}", f"gather_dim={gather_dim}"
        ):
            first, gathered = serve(rt, "function", "ag_gemm", (a2d, Bs[0]), {"gather_dim": gd}, keep)
    outs = [first] + [gathered @ b for b in Bs[1:]]
    ws = first.shape[0] // a2d.shape[0] if gd == 0 else Bs[0].shape[0] // a2d.shape[1]
    outs = [from_matrix(o, A_shard, gather_dim, ws) for o in outs]
    return (from_matrix(gathered, A_shard, gather_dim, ws) if return_A else None), outs


def _arguments_error(A_shard: Any, Bs: Any, gather_dim: Any) -> str | None:
    """Why these are not :func:`fused_all_gather_matmul`'s arguments (``None`` when they are)."""
    from ..runtime.agreement import check_dim

    if not isinstance(A_shard, torch.Tensor):
        return f"A_shard: expected a torch.Tensor, got {type(A_shard).__name__}"
    if not isinstance(Bs, (list, tuple)) or not Bs:
        return "Bs: at least one B is needed"
    for i, b in enumerate(Bs):
        if not isinstance(b, torch.Tensor):
            return f"Bs[{i}]: expected a torch.Tensor, got {type(b).__name__}"
    return check_dim("gather_dim", gather_dim, A_shard.dim(), "A_shard")


# -- bench rows -------------------------------------------------------------------------------------
def _parts(key: ProblemKey, ctx: RunContext, inputs: tuple, ws: Any) -> dict[str, Any]:
    """The all-gather into BSP's buffer, and the full ``A @ B``."""
    a_full = torch.randn((key["M"], key["K"]), device=ctx.device).to(torch_dtype(key.dtype))
    gemm_out = torch.empty((key["M"], key["N"]), dtype=a_full.dtype, device=ctx.device)
    return {
        "allgather": partial(all_gather_shards, inputs[0], ws.buffers["gathered"], ctx),
        "gemm": partial(torch.matmul, a_full, inputs[1], out=gemm_out),
    }


def _torch_fused(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    group_name = symm_group_name()
    a, b = inputs
    return lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, group_name)[1][0]


def _iris_stock(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    """Iris' stock kernel on a copy of the shard in the symmetric heap."""
    import iris.ops

    shmem = ctx.iris()
    a_shard, b = inputs
    a_sym = shmem.empty(a_shard.shape, dtype=a_shard.dtype)
    a_sym.copy_(a_shard)
    out = get_op("ag_gemm").empty_output(key, ctx.device)
    shmem.barrier()
    wsp = iris.ops.all_gather_matmul_preamble(shmem, a_sym, b)

    def run() -> Any:
        iris.ops.all_gather_matmul(shmem, out, a_sym, b, workspace=wsp)
        return out

    return run


_BENCH = BenchForm(
    parts=_parts,
    peers={
        # torch's symmetric memory must run its CUDA backend: beside bsp_symm (NCCL's), a group of its own
        "torch_fused": Peer(
            lambda key: key["gather_dim"] == 0, _torch_fused, apart_from=frozenset({"bsp_symm"})
        ),
        # Iris ships an all-gather + GEMM for gather_dim=1 only; it may hang, so it always runs apart
        "iris_stock": Peer(
            lambda key: key["gather_dim"] == 1 and key["K"] % key.world_size == 0,
            _iris_stock,
            alone=True,
            group_by=lambda key: (key["N"], key["K"], key.dtype),
        ),
    },
)

FORMS = {
    "compiled": CompiledForm(
        field="gather_dim", plain=_plain, opaque=_opaque, saving=_saving, backward_keeps=_backward_keeps
    ),
    "autograd": AutogradForm(call=_call),
    "functions": {"fused_all_gather_matmul": fused_all_gather_matmul},
    "bench": _BENCH,
}
