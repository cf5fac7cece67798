"""Runtime dispatch: ``dispatch("ag_gemm", a_shard, b, gather_dim=0)`` runs the tuned variant.

Collective: every rank of the group calls it with the same shapes. The first call of a process sets up a
:class:`Runtime` for the group (target, Iris allocator on NVIDIA, the table, agreed by all ranks); the
first call of a shape decides the variant (:mod:`.lookup`), checks that every rank decided the same,
and prepares the workspace. After that a call is one dictionary lookup and the variant's launch: no
database, no file, no logging, no environment read, no device synchronisation and no allocation by
dispatch itself. With ``out=None`` the output is allocated by the variant through torch's caching
allocator (no synchronisation; pass ``out=`` to avoid even that); it is never a workspace buffer that a
later call would overwrite.

Layouts: ``b`` may be row-major ``(K, N)`` or an nn.Linear weight passed as ``weight.t()``; the key's
``b_layout`` (``kn``/``nk``) comes from its strides, so each layout is served its own tuned record.
Inputs in other layouts (a non-contiguous ``a_shard``, a strided slice of B) are copied to one of those.

Autograd: when an input requires grad (and grad mode is on), backward computes ``grad_b = gathered_Aᵀ ·
grad_C`` and ``grad_a = reduce-scatter(grad_C · Bᵀ)`` along the gather dimension
(:mod:`autotaxer.integrations.autograd`).
Where B requires grad the forward also keeps the gathered A it communicated (``Variant.run_for_backward``);
a winner that cannot hand it out is replaced, for those calls only, by the fastest form that can as the
table knows it (``Plan.saving``, :func:`.lookup.saving_decision`); every other call (no grad, only A
requiring grad) is served by the winner. Every rank must call with the same ``requires_grad``.

What served: every call is counted per problem key, call path and variant (:func:`autotaxer.served`); the
hot path's count is the plan's call counter it always kept.

CUDA graphs: call each shape once before capturing (the first call allocates and talks to the other
ranks, which capture forbids: it raises a clear error instead); replays then launch the captured
kernels, whose flags advance by device-side epochs. Workspaces of shapes used in a captured graph must
stay cached: keep ``RuntimeConfig.workspace_cache`` above the number of shapes in use.

``torch.compile``: inside a compiled region ``dispatch`` becomes the custom op ``autotaxer::ag_gemm``
(:mod:`autotaxer.integrations.compiled`), whose fake implementation gives the output's shape to the tracer.

This module is the hot path (:func:`serve_hot`) and what it serves from; which path a call takes (under
``torch.compile``, differentiable, or the hot path) is decided one layer up, by
:func:`autotaxer.integrations.dispatch.dispatch` and :func:`autotaxer.integrations.autograd.serve`.

What is checked when: the first call of a signature on a rank checks its arguments and exchanges the
problem key, the decision, which inputs require grad and a wrapper's own arguments (``gather_dim`` of a
3-D ``A_shard``: :mod:`.agreement`) with every rank (any difference raises ``ConsensusError`` on every
rank, naming each rank's value). The ranks meet for that exchange in the process group's store first:
a rank that makes a first call while a peer serves a cached call (another shape, ``None``,
``requires_grad`` on one rank only) meets nobody and raises ``OutOfStepError`` after
``agree_timeout_s``, shutting the process group down so that the peer's collective fails too. Later
calls of a cached signature on every rank are checked by nobody: two ranks both serving cached but
different signatures with the same shard size are not seen, and a collective may then
pair with the wrong one. ``RuntimeConfig(check_calls=True)`` exchanges every call's signature first (a
collective per call: for debugging). Kernels' waits on peers are bounded (``peer_timeout_s``): a wait
that gave up raises :class:`~autotaxer.ops._peer_wait.PeerTimeoutError` at the next dispatch or
:func:`autotaxer.check`, and this process stops serving that variant for that key.
"""

from __future__ import annotations

import atexit
import functools
import itertools
from typing import Any

import torch

from .._problem import ProblemKey
from ..ops._peer_wait import IDLE, PeerTimeoutError
from ._runtimes import RUNTIMES as _RUNTIMES
from ._runtimes import add_runtime, get_runtime, shutdown
from .agreement import ConsensusError, OutOfStepError, RankAgreement, raise_if_peer_left
from .config import RuntimeConfig
from .context import RuntimeSetup
from .counts import CallCounts
from .decisions import KeyDecisions, MissTuner, problem_key
from .lookup import Decision
from .misses import Miss, default_misses_path
from .table import Table
from .workspaces import Workspaces


def _signature(op: str, tensors: tuple, layout: dict) -> tuple:
    """A call's full cache key: the op, each tensor's shape, strides and dtype, then the layout's items.

    Two-tensor calls (``ag_gemm``) are first looked up by the op, shapes, strides and dtypes alone (the
    hot index, see :meth:`Runtime.dispatch`), then their layout is compared with the plan's. Strides
    are part of it: they decide ``b_layout`` and whether the inputs must be copied first.
    """
    sig: list = [op]
    for t in tensors:
        sig += (t.shape, t.stride(), t.dtype)
    return (*sig, *layout.items())


def _hot_key(op: str, tensors: tuple) -> tuple | None:
    """The hot-index key of a call (what :func:`serve_hot` builds inline); ``None`` unless 2 tensors
    (``Runtime._find`` tells every rank which argument is not one)."""
    if len(tensors) != 2:
        return None
    x, y = tensors
    try:
        return (op, x.shape, x.stride(), x.dtype, y.shape, y.stride(), y.dtype)
    except AttributeError:
        return None


class Plan:
    """What the hot path needs for one call signature: ``run(workspace, inputs, ctx, out)`` and its state.

    ``layout`` is the layout the plan was made for: the hot index finds a plan by op, shapes, strides and
    dtypes, and the call's layout must equal it (else the full signature decides). ``run`` copies inputs
    into a layout the variants read first where the signature needs it. ``saving`` is the decision that
    serves calls needing what backward keeps (:func:`~.lookup.saving_decision`: the winner itself when it
    hands that out, else the fastest form that does); ``run_saving(inputs)`` returns ``(output, saved)``
    through it (its workspace and launcher from the runtime's ``forms``, kept across plans). Calls are
    counted per path and variant for :func:`autotaxer.served`: ``calls`` counts the hot path's (plain
    dispatch without grad, the winner), ``served`` every other call by ``(path, variant)``.
    """

    __slots__ = (
        "run", "workspace", "ctx", "key", "decision", "layout", "calls", "last_used", "variant", "opobj",
        "saving", "served", "_saving", "forms",
    )  # fmt: skip

    def __init__(
        self,
        run: Any,
        workspace: Any,
        ctx: Any,
        key: ProblemKey,
        decision: Decision,
        layout: dict[str, Any] | None = None,
        variant: Any = None,
        opobj: Any = None,
        saving: Decision | None = None,
        forms: Any = None,
    ) -> None:
        self.run = run
        self.workspace = workspace
        self.ctx = ctx
        self.key = key
        self.decision = decision
        self.layout = dict(layout) if layout is not None else {}
        self.calls = 0  # plain dispatch calls without grad (the hot path): served by the winner
        self.last_used = 0  # a tick of the runtime's clock: the least recently used plan is evicted first
        self.variant = variant
        self.opobj = opobj
        self.saving = saving if saving is not None else decision
        self.served: dict[tuple[str, str], int] = {}  # (path, variant) -> calls, beside the hot path's
        self._saving: Any = None  # (variant, workspace, run) that hands out what backward needs
        #: decision -> ``(variant, workspace, run)`` of the calls that keep what backward needs
        #: (``Workspaces._saving_form`` for this key: workspace and launcher kept across plans)
        self.forms = forms

    def count(self, path: str, variant: str) -> None:
        """Count one call of ``path`` served by ``variant`` (:func:`autotaxer.served`)."""
        key = (path, variant)
        self.served[key] = self.served.get(key, 0) + 1

    def total_calls(self) -> int:
        """Every call served through this plan since its counts were last collected."""
        return self.calls + sum(self.served.values())

    def forward(self, tensors: tuple, path: str, keep: bool) -> tuple[Any, Any]:
        """``(output, saved)`` of one call of ``path``, counted: ``keep`` (the caller needs what backward
        keeps) runs :meth:`run_saving`; otherwise the winner runs and ``saved`` is None."""
        if keep:
            return self.run_saving(tensors, path)
        self.count(path, self.decision.variant)
        return self.run(self.workspace, tensors, self.ctx, None), None

    def run_saving(self, tensors: tuple, path: str = "dispatch") -> tuple[Any, Any]:
        """``(output, saved)`` as fresh tensors through the ``saving`` form, counted under ``path``."""
        if self.opobj is not None and self.opobj.needs_canonical(tensors):
            tensors = self.opobj.canonical_inputs(tensors)
        if self._saving is None:
            self._saving = self.forms(self.saving)
        variant, ws, run = self._saving
        result = run(ws, tensors, self.ctx)
        if result is None:  # a variant that declared it saves but could not this time: the baseline's
            base = self.opobj.baseline()
            params = base.default_params(self.key, self.ctx.target)
            self._saving = self.forms(Decision(base.name, params))
            variant, ws, run = self._saving
            result = run(ws, tensors, self.ctx)
            if result is None:
                raise NotImplementedError(f"{self.key.op}: no variant supports autograd")
        self.count(path, variant.name)
        return result


def _canonicalizing(run: Any, opobj: Any) -> Any:
    """``run`` with the inputs first copied to a layout every variant reads (:meth:`Op.canonical_inputs`)."""

    def run_canonical(ws: Any, tensors: tuple, ctx: Any, out: Any = None) -> Any:
        return run(ws, opobj.canonical_inputs(tensors), ctx, out)

    return run_canonical


# -- the runtime ------------------------------------------------------------------------------------
class Runtime(RuntimeSetup, RankAgreement, KeyDecisions, Workspaces, CallCounts):
    """Dispatch state of one process group: context, agreed table, plans, workspaces and misses.

    Construction is cheap and local; the first :meth:`dispatch` (or :meth:`load`) sets up the device
    context and loads the table, collectively on every rank of ``group``. This class holds the state
    and the hot path; its other jobs are its bases': the set-up and table (:mod:`.context`), the
    exchanges with the other ranks (:mod:`.agreement`), each key's decision (:mod:`.decisions`), the
    plan and workspace cache (:mod:`.workspaces`), what was served and missed, and the close
    (:mod:`.counts`).
    """

    def __init__(self, config: RuntimeConfig | None = None, group: Any = None) -> None:
        self.config = config if config is not None else RuntimeConfig()
        self.config.validate()
        if self.config.symm_mem is not None:
            from ..ops._symm_backend import select

            select(self.config.symm_mem)
        self.group = group
        self.ctx: Any = None
        self.table: Table | None = None
        self._plans: dict[tuple, Plan] = {}  # full signature -> plan; bounded by workspace_cache
        self._hot: dict[tuple, Plan] = {}  # (op, shape, dtype, shape, dtype) -> a plan in _plans
        self._clock = itertools.count(1)
        self._workspaces: dict[tuple, Any] = {}
        self._launchers: dict[tuple, tuple[Any, Any]] = {}  # workspace key -> (workspace, launcher)
        self._saving_launchers: dict[tuple, tuple[Any, Any]] = {}  # the same for the saving calls
        self._decisions: dict[ProblemKey, Decision] = {}  # agreed by every rank; one per key
        self._misses: dict[ProblemKey, Miss] = {}
        self._warned: set[str] = set()
        self._closed = False
        #: waits on peers that gave up (read on every call: the alarm word against what was expected)
        self._watch: Any = IDLE
        self._checking = self.config.check_calls
        self._traced: set[ProblemKey] = set()  # keys decided while torch.compile traced (decide_call)
        self._traced_forms: dict[tuple[ProblemKey, str], int] = {}  # (key, variant) -> traces (plain)
        #: calls of dropped plans: (key, path, variant) -> calls, with the decision that served them
        self._served_before: dict[tuple[ProblemKey, str, str], tuple[int, Decision]] = {}
        self._inline: MissTuner | None = None  # tunes a miss at its first call (RuntimeConfig.tune_misses)
        self._misses_path = None
        if self.config.persist_misses:
            self._misses_path = self.config.misses_path or str(default_misses_path())
            atexit.register(self._persist_misses)

    # -- hot path ----------------------------------------------------------------------------------
    def dispatch(self, op: str, *tensors: Any, out: Any = None, **layout: int) -> Any:
        """Run ``op`` on this rank's ``tensors`` with the tuned variant; collective over the group. The hot
        path alone: :func:`autotaxer.dispatch` also serves calls under ``torch.compile`` and
        differentiable ones (an input requiring grad raises ``NotImplementedError`` here)."""
        return serve_hot(self, op, tensors, out, layout, _not_differentiable)

    def serving_plan(self, op: str, tensors: tuple, layout: dict[str, Any]) -> Plan:
        """The plan that serves a call of ``op`` by a path other than the hot one
        (:func:`autotaxer.integrations.autograd.serve`): the checks the hot path makes, then its plan
        (created, collectively, if new), marked as used. Collective, like :meth:`dispatch`."""
        w = self._watch
        if w.view[0] != w.expect or self._checking:
            self._before_call(op, tensors, layout)
        hot = _hot_key(op, tensors)
        plan = None if hot is None else self._hot.get(hot)
        if plan is None or plan.layout != layout:
            plan = self._find(op, tensors, layout)
        plan.last_used = next(self._clock)
        return plan

    def plan(self, op: str, *tensors: Any, **layout: int) -> Plan:
        """The plan a call with these arguments uses (created, collectively, if new); for benchmarks."""
        return self._find(op, tensors, layout)

    def _find(self, op: str, tensors: tuple, layout: dict[str, Any]) -> Plan:
        """Off the hot path: the plan of the full signature (created if new), then indexed as hot."""
        bad = _argument_error(tensors)
        if bad is not None:  # told to every rank before any of them waits for this one
            self._refuse(op, bad)
        sig = _signature(op, tensors, layout)
        plan = self._plans.get(sig)
        if plan is None:
            plan = self._new_plan(sig, op, tensors, layout)
        hot = _hot_key(op, tensors)
        if hot is not None:
            self._hot[hot] = plan  # replaces a plan of another layout with the same shapes, if any
        return plan

    # -- slow path: a new call signature -----------------------------------------------------------
    def _new_plan(self, sig: tuple, op: str, tensors: tuple, layout: dict[str, int]) -> Plan:
        """The plan of a new signature: set up at the first call, the key decided and agreed, the
        workspace prepared (collective); the least recently used plans beyond the cache are dropped."""
        from ..ops import get_op

        if self.table is None:
            self.load(tensors[0].device if tensors else None)
        if self.ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"dispatch({op!r}): first call of this shape during CUDA graph capture; call it once "
                "before capturing (the first call prepares workspaces and agrees with the other ranks)"
            )
        opobj = get_op(op)
        key, decision = self._decide(opobj, tensors, layout)
        variant = opobj.variants[decision.variant]
        ws = self._workspace(variant, key, decision)
        run = self._launcher(opobj, variant, key, decision, ws)
        if opobj.needs_canonical(tensors):
            run = _canonicalizing(run, opobj)
        saving = self._saving_decision(opobj, key, decision)
        plan = Plan(run, ws, self.ctx, key, decision, layout, variant, opobj, saving,
                    functools.partial(self._saving_form, opobj, key))  # fmt: skip
        plan.last_used = next(self._clock)  # newest: never the one evicted to make room for itself
        self._plans[sig] = plan
        self._evict()
        return plan

    # -- checks before a call ----------------------------------------------------------------------
    def _before_call(self, op: str, tensors: tuple, layout: dict[str, Any]) -> None:
        """What the hot path runs when a peer wait gave up (raise it, and stop serving that variant for
        that key) or in ``check_calls`` mode (compare the call with every rank's)."""
        w = self._watch
        if w.view[0] != w.expect:
            try:
                w.poll()
            except PeerTimeoutError:
                for rt in list(_RUNTIMES.values()) + [self]:
                    rt._forget_failed()
                raise
        if self._checking and self.world_size > 1:
            self._check_call(op, tensors, layout)


def _argument_error(tensors: tuple) -> str | None:
    """Why these are not dispatch's tensor arguments (``None`` when they are)."""
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            return f"tensor argument {i + 1}: expected a torch.Tensor, got {type(t).__name__}"
    return None


# -- module-level API -------------------------------------------------------------------------------
__all__ = [
    "ConsensusError", "Decision", "OutOfStepError", "Plan", "Runtime", "RuntimeConfig", "get_runtime",
    "init", "problem_key", "runtime_for", "serve_hot", "shutdown",
]  # fmt: skip


def init(config: RuntimeConfig | None = None, group: Any = None) -> Runtime:
    """Create the runtime that dispatch uses for ``group`` (replacing and closing an older one)."""
    return add_runtime(group, Runtime(config, group))


def runtime_for(group: Any = None) -> Runtime:
    """The runtime dispatch uses for ``group``, created with the default config if none yet."""
    rt = _RUNTIMES.get(group)
    return rt if rt is not None else init(None, group)


def _not_differentiable(plan: Plan, tensors: tuple, out: Any) -> Any:
    raise NotImplementedError(
        f"Runtime.dispatch({plan.key.op!r}): an input requires grad; autotaxer.dispatch differentiates it"
    )


def serve_hot(
    rt: Runtime, op: str, tensors: tuple[Any, ...], out: Any, layout: dict[str, int], differentiable: Any
) -> Any:
    """The hot path of :func:`autotaxer.dispatch` and :meth:`Runtime.dispatch` (their tuple and dict passed
    as they are: re-packing ``*tensors, **layout`` would cost ~0.7 µs a call). The hot key is exact for op,
    shapes, strides and dtypes and leaves the layout out (unpacking its items into the key cost more than
    comparing two small dicts); the layout must equal the plan's, else the full signature decides. A call
    whose input requires grad under grad mode is ``differentiable(plan, tensors, out)``'s (the caller's:
    :func:`autotaxer.integrations.autograd.differentiable_call`)."""
    try:
        w = rt._watch
        if w.view[0] != w.expect or rt._checking:
            rt._before_call(op, tensors, layout)
        if len(tensors) == 2:
            x, y = tensors
            try:
                plan = rt._hot.get((op, x.shape, x.stride(), x.dtype, y.shape, y.stride(), y.dtype))
            except AttributeError:  # not tensors: _find tells every rank which argument
                plan = None
            if plan is None or plan.layout != layout:
                plan = rt._find(op, tensors, layout)
            if (x.requires_grad or y.requires_grad) and torch.is_grad_enabled():
                plan.last_used = next(rt._clock)
                return differentiable(plan, tensors, out)  # counted by the op's autograd forward
        else:
            plan = rt._find(op, tensors, layout)
        plan.calls += 1
        plan.last_used = next(rt._clock)
        return plan.run(plan.workspace, tensors, plan.ctx, out)
    except OutOfStepError:
        raise
    except Exception as exc:  # a peer that left out of step made this call fail: named here too
        raise_if_peer_left(rt.group, exc)
        raise
