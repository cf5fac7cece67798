"""``gemm_rs``'s integrations (``FORMS``): its autograd, its custom op under ``torch.compile``,
``fused_matmul_reduce_scatter`` and what ``autotaxer bench`` times in its rows besides BSP, its variants
and dispatch: the reduce-scatter of the partial product alone and the local ``A_r @ B_r`` alone (the
ceiling of a fused kernel is the slower of them), and PyTorch's ``fused_matmul_reduce_scatter``
(scatter_dim=0).

Autograd: ``C_r = reduce-scatter(a · b)`` on every rank. Forward runs the winner whatever it can hand
out: backward needs only the inputs. Backward all-gathers ``grad_C`` and multiplies it by ``bᵀ`` in one
tuned all-gather GEMM, which also returns the gathered ``grad_C`` where ``b`` requires grad (then
``grad_b = aᵀ · gathered grad_C``); else that GEMM's winner serves whatever it can hand out.

Under ``torch.compile``::

    torch.ops.autotaxer.gemm_rs(a, b, scatter_dim, group_name) -> Tensor (its slice of sum_r a_r b_r)

Its autograd registration runs the backward as one tuned all-gather GEMM (the backward op's ``saving``
custom op), which also returns the gathered ``grad_out`` for the weight's gradient. :mod:`.compiled`
decides which form a call gets.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from .._problem import ProblemKey
from ..ops import RunContext
from ..ops._collectives import reduce_scatter
from ..ops._forms import AutogradForm, BenchForm, CompiledForm, Peer
from ..ops._matmul import linear_product, weight_grad
from ..ops._torch_symm import symm_group_name
from ..ops.gemm_rs._op import out_shape
from ..runtime._groups import collective_name, functional_collective, resolve, world_size
from ..runtime.dispatch import runtime_for
from . import form
from ._library import define
from ._signature import group_arg, refuse
from .autograd import serve

#: The op that computes this op's input gradient (``all_gather(grad_C) · Bᵀ``, keeping the gathered one).
BACKWARD_OP = "ag_gemm"


# -- autograd ---------------------------------------------------------------------------------------
class GemmRsFunction(torch.autograd.Function):
    """``C_r = reduce-scatter(a · b)`` through a dispatch plan, differentiable in both inputs."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, plan: Any, path: str) -> torch.Tensor:
        out, _ = plan.forward((a, b), path, False)
        ctx.save_for_backward(a, b)
        ctx.scatter_dim = plan.key["scatter_dim"]
        ctx.group = plan.ctx.group
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        a, b = ctx.saved_tensors
        rt = runtime_for(ctx.group)
        keep = ctx.needs_input_grad[1]  # the gathered grad_out, for b's gradient only
        layout = {"gather_dim": ctx.scatter_dim}
        grad_a, gathered = serve(rt, "backward", BACKWARD_OP, (grad_out.contiguous(), b.t()), layout, keep)
        grad_b = weight_grad(a, gathered, b) if keep else None
        return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None


def _call(tensors: tuple, plan: Any, path: str, keep: bool) -> tuple[torch.Tensor, None]:
    """Backward keeps nothing the forward communicated: ``saved`` is None, ``keep`` or not."""
    return GemmRsFunction.apply(*tensors, plan, path), None


# -- torch.compile ----------------------------------------------------------------------------------
def gemm_rs(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of the sum over ranks of ``a @ b`` (tuned variant)."""
    rt = runtime_for(resolve(group_name))
    with torch.no_grad():
        return serve(rt, "compiled", "gemm_rs", (a, b), {"scatter_dim": scatter_dim})[0]


def _gemm_rs_fake(a: torch.Tensor, b: torch.Tensor, scatter_dim: int, group_name: str) -> torch.Tensor:
    ws = world_size(group_name)
    m, n = a.shape[0], b.shape[1]
    return a.new_empty((m // ws, n) if scatter_dim == 0 else (m, n // ws))


define("gemm_rs", "(Tensor a, Tensor b, int scatter_dim, str group_name) -> Tensor", gemm_rs, _gemm_rs_fake)


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    a, b, scatter_dim, group_name = inputs
    ctx.save_for_backward(a, b)
    ctx.scatter_dim, ctx.group_name = scatter_dim, group_name


def _backward(ctx: Any, grad_out: torch.Tensor):
    """One tuned all-gather GEMM of ``grad_out`` with ``bᵀ``; where ``b`` requires grad it also returns the
    gathered ``grad_out`` (else its winner serves whatever it can hand out)."""
    a, b = ctx.saved_tensors
    compiled = form(BACKWARD_OP, "compiled")
    args = (grad_out.contiguous(), b.t(), ctx.scatter_dim, ctx.group_name)
    if ctx.needs_input_grad[1]:
        grad_a, gathered = compiled.saving(*args)
        grad_b = weight_grad(a, gathered, b)
    else:
        grad_a, grad_b = compiled.opaque(*args), None
    return (grad_a if ctx.needs_input_grad[0] else None), grad_b, None, None


torch.library.register_autograd("autotaxer::gemm_rs", _backward, setup_context=_setup)


def _plain(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> tuple[torch.Tensor, None]:
    """BSP as plain PyTorch writes it, traceable and differentiable: ``(C slice, None)``."""
    group = collective_name(name)
    return functional_collective("reduce_scatter")(linear_product(a, b), "sum", dim, group), None


def _opaque(a: torch.Tensor, b: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    return torch.ops.autotaxer.gemm_rs(a, b, dim, name)


# -- fused_matmul_reduce_scatter --------------------------------------------------------------------
def fused_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: Any = None
) -> torch.Tensor:
    """This rank's slice along ``scatter_dim`` of ``sum over ranks of A @ B`` (``reduce_op`` ``"sum"``
    or ``"avg"``); collective: ``torch.ops.symm_mem.fused_matmul_reduce_scatter``'s contract, as one tuned
    ``gemm_rs``. ``A`` is ``(..., K_r)``, ``B`` ``(K_r, N)`` (row-major or ``weight.t()``).
    """
    from ..runtime.agreement import calling

    group = group_arg(group_name)
    error = _arguments_error(A, B, reduce_op, scatter_dim)
    if error is not None:  # told to every rank: each raises, none waits for this one
        refuse("gemm_rs", group, ValueError(f"fused_matmul_reduce_scatter: {error}"))
    out_dims = A.dim()  # the product has A's dims, its last one N
    scatter_dim %= out_dims
    if scatter_dim == out_dims - 1:
        a2d, sd = A.reshape(-1, A.shape[-1]), 1
    else:
        a2d, sd = A.movedim(scatter_dim, 0).reshape(-1, A.shape[-1]), 0
    if torch.compiler.is_compiling():  # traced BSP, or the custom op with its autograd registration
        from .compiled import compiled_call

        out = compiled_call("gemm_rs", a2d, B, sd, group)[0]
    else:
        with calling(
            "fused_matmul_reduce_scatter", f"A {tuple(A.shape)}", f"scatter_dim={scatter_dim}", reduce_op
        ):
            out = serve(runtime_for(group), "function", "gemm_rs", (a2d, B), {"scatter_dim": sd})[0]
    ws = a2d.shape[0] // out.shape[0] if sd == 0 else B.shape[1] // out.shape[1]
    if reduce_op == "avg":
        out = out / ws
    if sd == 1:
        return out.reshape(*A.shape[:-1], out.shape[-1])
    moved = list(A.movedim(scatter_dim, 0).shape)
    moved[0] //= ws
    return out.reshape(*moved[:-1], out.shape[-1]).movedim(0, scatter_dim)


def _arguments_error(A: Any, B: Any, reduce_op: Any, scatter_dim: Any) -> str | None:
    """Why these are not :func:`fused_matmul_reduce_scatter`'s arguments (``None`` when they are)."""
    from ..runtime.agreement import check_dim

    if reduce_op not in ("sum", "avg"):
        return f"reduce_op: expected 'sum' or 'avg', got {reduce_op!r}"
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            return f"{name}: expected a torch.Tensor, got {type(t).__name__}"
    return check_dim("scatter_dim", scatter_dim, A.dim(), "product")


# -- bench rows -------------------------------------------------------------------------------------
def _parts(key: ProblemKey, ctx: RunContext, inputs: tuple, ws: Any) -> dict[str, Any]:
    """The reduce-scatter of BSP's partial product, and the local GEMM."""
    partial_product = ws.buffers["partial"]
    rs_out = torch.empty(out_shape(key), dtype=partial_product.dtype, device=ctx.device)
    return {
        "reduce_scatter": partial(reduce_scatter, partial_product, rs_out, key["scatter_dim"], ctx.group),
        "gemm": partial(torch.matmul, inputs[0], inputs[1], out=torch.empty_like(partial_product)),
    }


def _torch_fused(key: ProblemKey, ctx: RunContext, inputs: tuple) -> Any:
    group_name = symm_group_name()
    a, b = inputs
    return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)


FORMS = {
    "compiled": CompiledForm(field="scatter_dim", plain=_plain, opaque=_opaque),
    "autograd": AutogradForm(call=_call),
    "functions": {"fused_matmul_reduce_scatter": fused_matmul_reduce_scatter},
    "bench": BenchForm(
        parts=_parts,
        # torch's symmetric memory must run its CUDA backend: beside bsp_symm (NCCL's), a group of its own
        peers={
            "torch_fused": Peer(
                lambda key: key["scatter_dim"] == 0, _torch_fused, apart_from=frozenset({"bsp_symm"})
            )
        },
    ),
}
