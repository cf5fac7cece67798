"""PyTorch's async tensor parallelism served by autotaxer: ``autotaxer.async_tp.enable()``.

With async TP on (``torch._inductor.config._micro_pipeline_tp = True`` and symmetric memory enabled for the
TP group, or torchtitan's ``enable_async_tensor_parallel``), inductor's micro-pipeline pass rewrites
all-gather → matmul and matmul → reduce-scatter into ``torch.ops.symm_mem.fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter``, which run one fixed algorithm at every shape. After :func:`enable`, every
call of those two ops on CUDA, eager or compiled, goes to autotaxer's dispatch when the tuning table has a
record for its problem key (exact, or a neighbouring M), and to torch's own implementation otherwise
(an untuned key, a dtype or layout autotaxer does not take, a key served plain BSP whose record says
torch's kernel ran faster alone: the in-step check compared the winner with BSP in a step without async
TP, where BSP is the alternative; here torch's kernel is): torch's kernel is kept, not re-implemented,
and reached as a Python function (:mod:`autotaxer.ops._torch_symm`), so the override never calls itself.
The fp8 forms (``fused_all_gather_scaled_matmul``, ``fused_scaled_matmul_reduce_scatter``) stay torch's.
Outputs have the sizes and strides of torch's meta function (compiled code asserts them).

**Mechanism: a kernel override, not a graph pass.** Inductor has no lowering for these ops: the compiled
code calls them as fallback kernels through the dispatcher at run time. So :func:`enable` registers
autotaxer's kernels for the ``CUDA`` dispatch key of the two ops (``torch.library.Library("symm_mem",
"IMPL").impl(..., allow_override=True)``) and :func:`disable` removes them; the dispatcher then runs
torch's kernel again (it keeps every registration of a key, the newest active). The compiled graph is the
same with or without autotaxer, so the FX graph and AOTAutograd caches keep working, eager calls are served
too, and enable/disable act on already compiled code at its next call. An inductor ``CustomGraphPass``
(``post_grad_custom_post_pass``) would have taken the one slot users have for their own pass, split the
cache by its uuid, served compiled code only, and decided at compile time, before the table is known.

**Torch versions.** ``Library.impl`` has ``allow_override`` from 2.8 on (default False up to 2.12, True
in 2.13): torch <= 2.7 refuses to override a kernel registered from Python, and :func:`enable` raises
naming the version; from 2.8 on :func:`enable` passes ``allow_override=True``. A schema without
``return_A`` (older torch) never passes it. Checked on 2.13 (CPU: registration, fallback, meta layouts,
compiled calls); the GPU tests run on the lent machines' 2.11. A torch whose kernels of these ops are no
longer Python functions makes :func:`enable` raise (the fallback would call the override); an inductor
that lowers the ops itself (compiled code would skip the dispatcher) shows as zero :func:`counters`.

**Warm-up.** The first call of a shape decides (collectively, as dispatch does) and records an untuned key
as a dispatch miss, so a compiled model's keys are listed by ``autotaxer misses`` after one step and are
served once tuned (``autotaxer.init`` with the new table: decisions are remade for a new runtime). The
decision is ``Runtime.plan``'s, which also prepares the baseline's workspace of an untuned key (a gathered-A
buffer, within ``RuntimeConfig.workspace_cache``) although torch's kernel runs that key. A decision holds
while its runtime keeps the key's (``Runtime.forget`` drops it): :func:`autotaxer.warmup` records a
compiled model's calls (it runs the step compiled once more while async TP is on), tunes them in the
launch, and the next call serves the winners.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .integrations._signature import from_matrix, to_matrix
from .integrations.autograd import serve as serve_call
from .ops import _torch_symm
from .runtime._runtimes import RUNTIMES

__all__ = ["counters", "decisions", "disable", "enable", "is_enabled", "reset_counters", "unavailable_reason"]

#: torch's op name -> autotaxer's op that serves it
OPS = {"fused_all_gather_matmul": "ag_gemm", "fused_matmul_reduce_scatter": "gemm_rs"}
#: Most call signatures whose decision is kept (then the oldest is dropped and decided again on use).
MAX_SIGNATURES = 512
SERVED, TORCH = "autotaxer", "torch"


@dataclass(frozen=True)
class _Entry:
    """The decision for one call signature, made against one runtime."""

    runtime: Any  # the runtime that decided; a new runtime (autotaxer.init) decides again
    group: Any
    world_size: int
    serve: bool
    layouts: tuple  # (size, stride) of each output as torch's meta function gives it (None: no output)
    call: dict  # what decisions() reports: the op, its inputs' sizes, strides and dtypes, its other arguments
    key: Any = None  # autotaxer's problem key (None: a call autotaxer does not take)


class _State:
    def __init__(self) -> None:
        self.library: Any = None
        self.dispatch_key = ""
        self.impls_before: set[str] = set()
        self.entries: dict[tuple, _Entry] = {}
        self.counts = {name: {SERVED: 0, TORCH: 0} for name in OPS}


_STATE = _State()


# -- public API -------------------------------------------------------------------------------------
def unavailable_reason() -> str | None:
    """Why :func:`enable` cannot work with this torch (None when it can)."""
    originals_reason = _torch_symm.originals_reason

    reason = originals_reason()
    if reason is not None:
        return reason
    if "allow_override" not in inspect.signature(torch.library.Library.impl).parameters:
        return (
            f"torch {torch.__version__} cannot override a kernel registered from Python "
            "(torch.library.Library.impl has no allow_override; torch 2.8 or newer has it)"
        )
    return None


def enable() -> None:
    """Serve torch's fused all-gather-matmul and matmul-reduce-scatter ops on CUDA by autotaxer's dispatch
    (torch's own kernel where autotaxer has no tuned record); idempotent. ``RuntimeError`` when this torch
    cannot (:func:`unavailable_reason`) or no CUDA device is visible (the ops would never be served)."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "autotaxer.async_tp.enable(): no CUDA device is visible to this process; the overridden ops "
            "run on CUDA only, so nothing would be served"
        )
    _install("CUDA")


def disable() -> None:
    """Give both ops back to torch's kernels; idempotent. Counters and decisions are kept (a decision is
    remade only for a new runtime)."""
    lib = _STATE.library
    if lib is None:
        return
    lib._destroy()  # the dispatcher's registrations made through lib go; torch's kernels are active again
    # torch.library's books of Python kernels have one entry per (op, key): _destroy dropped torch's own
    # entries with ours, and lib's finalizer would drop them again when lib is collected.
    mine = getattr(lib, "_op_impls", None)
    if isinstance(mine, set):
        mine.clear()
    impls = getattr(torch.library, "_impls", None)
    if isinstance(impls, set):
        impls |= _STATE.impls_before
    _STATE.library = None
    _STATE.dispatch_key = ""


def is_enabled() -> bool:
    """Whether autotaxer's kernels serve the ops now."""
    return _STATE.library is not None


def counters() -> dict[str, dict[str, int]]:
    """Calls since the last reset, per torch op: ``{"fused_all_gather_matmul": {"autotaxer": n, "torch":
    m}, "fused_matmul_reduce_scatter": {...}}`` (served by autotaxer's dispatch, or by torch's kernel)."""
    return {name: dict(c) for name, c in _STATE.counts.items()}


def decisions() -> list[dict[str, Any]]:
    """The call signatures decided so far (oldest first, at most :data:`MAX_SIGNATURES`): ``op`` (torch's
    op name), ``inputs`` (``(size, stride, dtype)`` of A then each B), ``args`` (the other arguments),
    ``served`` (by autotaxer, else torch's kernel) and ``key`` (autotaxer's problem key, None when the call
    was not one autotaxer takes). For benchmarks that replay a compiled model's calls one by one."""
    return [dict(e.call) for e in _STATE.entries.values()]


def reset_counters() -> None:
    """Set every counter of :func:`counters` to zero."""
    for c in _STATE.counts.values():
        c[SERVED] = c[TORCH] = 0


# -- registration -----------------------------------------------------------------------------------
def _install(dispatch_key: str) -> None:
    """Register the two kernels for ``dispatch_key`` (``CUDA``; the CPU tests use ``CPU`` on gloo)."""
    if _STATE.library is not None:
        if _STATE.dispatch_key == dispatch_key:
            return
        disable()
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"autotaxer.async_tp.enable(): {reason}")
    impls = getattr(torch.library, "_impls", set())
    keys = {f"symm_mem/{name}/{dispatch_key}" for name in OPS}
    lib = torch.library.Library("symm_mem", "IMPL")
    with warnings.catch_warnings():
        # the dispatcher warns once that a kernel is overridden: here that is the point
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        lib.impl("fused_all_gather_matmul", _all_gather_matmul, dispatch_key, allow_override=True)
        lib.impl("fused_matmul_reduce_scatter", _matmul_reduce_scatter, dispatch_key, allow_override=True)
    _STATE.impls_before = {k for k in keys if k in impls}
    _STATE.library = lib
    _STATE.dispatch_key = dispatch_key


# -- decisions --------------------------------------------------------------------------------------
def _lookup(sig: tuple) -> _Entry | None:
    """The signature's decision while it holds: made by the group's current runtime, and its key not
    forgotten since (``Runtime.forget``: a warm-up tuned it, or recorded it)."""
    entry = _STATE.entries.get(sig)
    if entry is None or RUNTIMES.get(entry.group) is not entry.runtime:
        return None
    if entry.key is not None and not entry.runtime.has_decision(entry.key):
        return None
    return entry


def _remember(sig: tuple, entry: _Entry) -> _Entry:
    entries = _STATE.entries
    entries.pop(sig, None)
    while len(entries) >= MAX_SIGNATURES:
        del entries[next(iter(entries))]
    entries[sig] = entry
    return entry


def _layouts(outputs: Any) -> tuple:
    return tuple(None if t is None else (tuple(t.shape), tuple(t.stride())) for t in outputs)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _unsupported_ag(a: torch.Tensor, bs: list, gather_dim: int) -> str | None:
    """Why autotaxer does not take this call (torch's kernel runs it, with torch's own checks)."""
    if a.dim() < 2 or not bs or any(b.dim() != 2 for b in bs):
        return "A_shard of 2 or more dimensions and 2-D Bs"
    if not 0 <= gather_dim < a.dim():
        return f"gather_dim {gather_dim} is not a dimension of A_shard"
    if any(b.dtype != a.dtype or b.device != a.device for b in bs):
        return "A_shard and every B of one dtype and device"
    return None


def _unsupported_rs(a: torch.Tensor, b: torch.Tensor, reduce_op: str, scatter_dim: int) -> str | None:
    if a.dim() < 2 or b.dim() != 2:
        return "A of 2 or more dimensions and a 2-D B"
    if not 0 <= scatter_dim < a.dim():
        return f"scatter_dim {scatter_dim} is not a dimension of the product"
    if reduce_op not in ("sum", "avg"):
        return f"reduce_op {reduce_op!r}"
    if b.dtype != a.dtype or b.device != a.device:
        return "A and B of one dtype and device"
    return None


def _decide(
    sig: tuple, call: dict, unsupported: str | None, plan_inputs: Any, meta: Any, needs_saved: bool = False
) -> _Entry:
    """Decide once per signature (collectively: every rank decides the same, as dispatch does).
    ``needs_saved``: the call returns the gathered A (``return_A``, or several ``Bs``): a winner that
    cannot hand it out is replaced by the fastest form that can as the table knows it (``Plan.saving``);
    where the table knows none, torch's kernel serves it (it returns the gathered A at no cost)."""
    from .integrations._signature import group_world_size, resolve_group
    from .runtime.dispatch import ConsensusError, runtime_for
    from .runtime.lookup import EXACT, NEAREST

    op = OPS[call["op"]]
    group = resolve_group(call["args"]["group_name"])
    rt = runtime_for(group)
    serve, why, key = False, unsupported, None
    if unsupported is None:
        try:
            tensors, layout = plan_inputs()
            plan = rt.plan(op, *tensors, **layout)
            serve, key = plan.decision.source in (EXACT, NEAREST), plan.key
            if needs_saved and plan.saving is not plan.decision and plan.saving.tuned_key is None:
                serve = False
            run = plan.saving if needs_saved else plan.decision
            if serve and _torch_kernel_was_faster(rt, op, run, plan.decision.tuned_key):
                serve = False
        except (ValueError, KeyError, ConsensusError) as exc:  # raised on every rank alike
            why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        warnings.warn(
            f"autotaxer.async_tp: torch's kernel runs {op} here ({why})", RuntimeWarning, stacklevel=4
        )
    layouts = _layouts(meta()) if serve else ()
    call = {**call, "served": serve, "key": None if key is None else key.text}
    return _remember(sig, _Entry(rt, group, group_world_size(group), serve, layouts, call, key))


def _torch_kernel_was_faster(rt: Any, op: str, run: Any, tuned_key: Any) -> bool:
    """Whether ``run`` is ``op``'s plain BSP at a key whose record says torch's fused kernel ran faster
    alone: the in-step check turned the winner down for BSP in a step whose alternative was BSP, but
    here the alternative is torch's kernel, which async TP runs without autotaxer."""
    from .ops import get_op
    from .records import isolated_fastest_form

    if run.variant != get_op(op).baseline().name or tuned_key is None:
        return False
    rec = rt.table.records.get(tuned_key)
    return rec is not None and isolated_fastest_form(rec.env) == _torch_symm.TorchFusedForm.name


def _call(op: str, tensors: list, **args: Any) -> dict:
    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch.")) for t in tensors]
    return {"op": op, "inputs": inputs, "args": args}


def _conform(t: torch.Tensor, layout: tuple) -> torch.Tensor:
    """``t`` with the size and strides torch's meta function gives (a copy only where they differ)."""
    size, stride = layout
    if tuple(t.shape) != size:
        raise RuntimeError(f"autotaxer.async_tp: output of size {tuple(t.shape)}, torch's meta gives {size}")
    if all(s == e or n <= 1 for s, e, n in zip(t.stride(), stride, size, strict=True)):
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


# -- the kernels --------------------------------------------------------------------------------------
def _all_gather_matmul(
    A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, group_name: str, *, return_A: bool = True
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """``symm_mem::fused_all_gather_matmul`` served by autotaxer's ``ag_gemm`` (torch's without a record)."""
    # the tensors' device is not in the key: the dispatch key and the group's runtime fix it
    sig = (A_shard.shape, A_shard.stride(), A_shard.dtype, gather_dim, group_name, return_A)
    sig += tuple((b.shape, b.stride(), b.dtype) for b in Bs)
    entry = _lookup(sig)
    if entry is None:

        def plan_inputs() -> tuple:
            a2d, gd = to_matrix(A_shard, gather_dim)
            return (a2d, Bs[0]), {"gather_dim": gd}

        def meta() -> tuple:
            a, outs = torch.ops.symm_mem.fused_all_gather_matmul.default(
                _meta(A_shard), [_meta(b) for b in Bs], gather_dim, group_name, return_A=return_A
            )
            return (a, *outs)

        call = _call(
            "fused_all_gather_matmul", [A_shard, *Bs], gather_dim=gather_dim, group_name=group_name,
            return_A=return_A,
        )  # fmt: skip
        unsupported = _unsupported_ag(A_shard, Bs, gather_dim)
        entry = _decide(sig, call, unsupported, plan_inputs, meta, needs_saved=return_A or len(Bs) > 1)
    counts = _STATE.counts["fused_all_gather_matmul"]
    if not entry.serve:
        counts[TORCH] += 1
        return _torch_symm.all_gather_matmul(A_shard, Bs, gather_dim, group_name, return_A=return_A)
    counts[SERVED] += 1
    return _serve_all_gather_matmul(entry, A_shard, Bs, gather_dim, return_A)


def _serve_all_gather_matmul(
    entry: _Entry, A_shard: torch.Tensor, Bs: list[torch.Tensor], gather_dim: int, return_A: bool
) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    rt, ws = entry.runtime, entry.world_size
    with torch.no_grad():  # below autograd: the kernel builds no graph
        a2d, gd = to_matrix(A_shard, gather_dim)
        keep = return_A or len(Bs) > 1  # a form that hands out the gathered A it communicated
        first, gathered = serve_call(rt, "async_tp", "ag_gemm", (a2d, Bs[0]), {"gather_dim": gd}, keep)
        outs = [first] + [gathered @ b for b in Bs[1:]]
        layouts = entry.layouts
        outs = [
            _conform(from_matrix(o, A_shard, gather_dim, ws), lay)
            for o, lay in zip(outs, layouts[1:], strict=True)
        ]
        a = _conform(from_matrix(gathered, A_shard, gather_dim, ws), layouts[0]) if return_A else None
    return a, outs


def _rs_matrix(A: torch.Tensor, scatter_dim: int) -> tuple[torch.Tensor, int]:
    """``A`` as the 2-D ``a`` of a ``gemm_rs`` and that op's scatter_dim (0: rows, 1: columns)."""
    if scatter_dim == A.dim() - 1:
        return A.reshape(-1, A.shape[-1]), 1
    return A.movedim(scatter_dim, 0).reshape(-1, A.shape[-1]), 0


def _matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str
) -> torch.Tensor:
    """``symm_mem::fused_matmul_reduce_scatter`` served by autotaxer's ``gemm_rs`` (torch's without a
    record)."""
    sig = (A.shape, A.stride(), A.dtype, B.shape, B.stride(), B.dtype, reduce_op, scatter_dim, group_name)
    entry = _lookup(sig)
    if entry is None:

        def plan_inputs() -> tuple:
            a2d, sd = _rs_matrix(A, scatter_dim)
            return (a2d, B), {"scatter_dim": sd}

        def meta() -> tuple:
            out = torch.ops.symm_mem.fused_matmul_reduce_scatter.default(
                _meta(A), _meta(B), reduce_op, scatter_dim, group_name
            )
            return (out,)

        call = _call(
            "fused_matmul_reduce_scatter", [A, B], reduce_op=reduce_op, scatter_dim=scatter_dim,
            group_name=group_name,
        )  # fmt: skip
        entry = _decide(sig, call, _unsupported_rs(A, B, reduce_op, scatter_dim), plan_inputs, meta)
    counts = _STATE.counts["fused_matmul_reduce_scatter"]
    if not entry.serve:
        counts[TORCH] += 1
        return _torch_symm.matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    counts[SERVED] += 1
    ws = entry.world_size
    with torch.no_grad():
        a2d, sd = _rs_matrix(A, scatter_dim)
        out = serve_call(entry.runtime, "async_tp", "gemm_rs", (a2d, B), {"scatter_dim": sd})[0]
        if reduce_op == "avg":
            out = out / ws
        if sd == 1:
            out = out.reshape(*A.shape[:-1], out.shape[-1])
        else:
            moved = list(A.movedim(scatter_dim, 0).shape)
            moved[0] //= ws
            out = out.reshape(*moved[:-1], out.shape[-1]).movedim(0, scatter_dim)
        return _conform(out, entry.layouts[0])
