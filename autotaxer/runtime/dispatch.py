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
import itertools
import logging
import math
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

import torch

from .._problem import ProblemKey, Target
from ..ops._peer_wait import IDLE, PeerTimeoutError, peer_watch
from ._runtimes import RUNTIMES as _RUNTIMES
from ._runtimes import add_runtime, current_recorder, get_runtime, shutdown
from .agreement import AGREE_TIMEOUT_S, ConsensusError, OutOfStepError, exchange, raise_if_peer_left
from .lookup import FALLBACK, Decision, decide, saving_decision
from .misses import Miss, append_misses, default_misses_path
from .table import Table, TableSources, load_table, merge

_log = logging.getLogger("autotaxer.dispatch")


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
    """The hot-index key of a call (what :func:`dispatch` builds inline); ``None`` unless 2 tensors."""
    if len(tensors) != 2:
        return None
    x, y = tensors
    return (op, x.shape, x.stride(), x.dtype, y.shape, y.stride(), y.dtype)


#: the longest bound of a wait on peers that a config accepts, in seconds (kernels count it in int64 ns)
MAX_WAIT_S = 86400.0


@dataclass(frozen=True)
class RuntimeConfig(TableSources):
    """Settings of a runtime; defaults suit most users. Where the table comes from (``tables``,
    ``db_url``, ``env_tables``, ``shipped_tables``, ``strict``, ``timing``) is declared by the base class,
    :class:`~autotaxer.runtime.table.TableSources`.

    ``tables``: extra table files or folders, highest precedence (then ``$AUTOTAXER_TABLE`` when
    ``env_tables``, then ``db_url``, then the shipped ``tuning_db/`` when ``shipped_tables``).
    ``strict``: refuse records tuned with other kernel sources or torch/triton/iris versions.
    ``timing``: ``"graph"`` serves only winners tuned with ``autotaxer tune --timing graph`` (BSP for the
    rest), for code that runs dispatch inside CUDA graphs, where BSP's launch costs vanish and an eager
    winner can lose; ``"eager"`` only eager-tuned ones; None (default) any record.
    ``max_m_ratio``: nearest-M lookup accepts a tuned M within this factor of the requested M.
    ``min_nearest_speedup``: ... and only a winner that beat BSP there at least by this factor.
    ``workspace_cache``: most (shape, variant, params) workspaces kept (least recently used dropped).
    ``misses_path``: where rank 0 appends misses at shutdown (None: ``$AUTOTAXER_MISSES`` or the default
    file); ``persist_misses=False`` keeps them in memory only.
    ``peer_timeout_s``: how long a kernel's wait on a peer may spin before it gives up and dispatch raises
    ``PeerTimeoutError`` (None: ``$AUTOTAXER_PEER_TIMEOUT``, else 5 s); ``first_call_timeout_s``: the
    bound of a workspace's first call, while ranks may still be compiling (at least ``peer_timeout_s``).
    ``agree_timeout_s``: how long a signature's first call waits for every rank to come to its exchange
    before it raises ``OutOfStepError`` (a peer that never comes called differently and waits elsewhere).
    ``check_calls``: before every call, exchange its signature (op, shapes, strides, dtypes, layout,
    ``requires_grad``) with every rank and raise on all of them when they differ: a collective per call,
    for debugging (without it only a signature's first call is compared).
    ``symm_mem``: the backend torch's symmetric memory runs in this process, one a process: ``"cuda"``
    (torch's fused ops and PyTorch's async TP; the default) or ``"nccl"`` (NCCL's symmetric BSP forms);
    None keeps ``$AUTOTAXER_SYMM_MEM``.
    ``tune_misses``: seconds a key with no tuned record may be tuned at its first call, every rank of the
    group taking part (:mod:`autotaxer.tuner.in_group`), before that call is served its winner; None
    (default): never. A key ``torch.compile`` first meets while tracing is not (``autotaxer.warmup`` is).
    ``tune_misses_total_s``: the most seconds this runtime spends so. Trials and winners go to ``db_url``
    (default: the default database, which is then also a table source).
    """

    heap_size: int = 1 << 30
    max_m_ratio: float = 2.0
    min_nearest_speedup: float = 1.1
    workspace_cache: int = 64
    misses_path: str | None = None
    persist_misses: bool = True
    peer_timeout_s: float | None = None
    first_call_timeout_s: float = 30.0
    check_calls: bool = False
    agree_timeout_s: float = AGREE_TIMEOUT_S
    symm_mem: str | None = None
    tune_misses: float | None = None
    tune_misses_total_s: float = 600.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value is unusable."""
        from ..ops._symm_backend import CHOICES

        if self.symm_mem is not None and self.symm_mem not in CHOICES:
            raise ValueError(f"symm_mem: expected one of {', '.join(CHOICES)}, got {self.symm_mem!r}")
        if self.heap_size <= 0:
            raise ValueError(f"heap_size: must be positive, got {self.heap_size}")
        if not (self.max_m_ratio >= 1.0 and math.isfinite(self.max_m_ratio)):
            raise ValueError(f"max_m_ratio: must be a finite number >= 1, got {self.max_m_ratio}")
        if not (self.min_nearest_speedup > 0 and math.isfinite(self.min_nearest_speedup)):
            raise ValueError(
                f"min_nearest_speedup: must be a finite number > 0, got {self.min_nearest_speedup}"
            )
        if self.workspace_cache < 1:
            raise ValueError(f"workspace_cache: must be at least 1, got {self.workspace_cache}")
        for name in (
            "peer_timeout_s", "first_call_timeout_s", "agree_timeout_s", "tune_misses", "tune_misses_total_s"
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        for name, value in (
            ("peer_timeout_s", self.peer_timeout()),
            ("first_call_timeout_s", self.first_call_timeout_s),
            ("agree_timeout_s", self.agree_timeout_s),
        ):
            if value > MAX_WAIT_S:  # kernels count the bound in int64 nanoseconds, the store in a timedelta
                where = (
                    "$AUTOTAXER_PEER_TIMEOUT"
                    if name == "peer_timeout_s" and self.peer_timeout_s is None
                    else name
                )
                raise ValueError(f"{where}: at most {MAX_WAIT_S:.0f} seconds (one day), got {value!r}")
        sources = self.table_sources()
        sources.validate()
        for path in sources.tables:  # refused at init, not at the first call
            if not Path(path).expanduser().exists():
                raise ValueError(f"tables: {path}: no such table file or folder")

    def peer_timeout(self) -> float:
        """The bound of kernels' waits on peers, in seconds (``peer_timeout_s``, else the environment's)."""
        from autotaxer.kernels.common.watch import timeout_from_env

        return float(self.peer_timeout_s) if self.peer_timeout_s is not None else timeout_from_env()

    def tuning_db_url(self) -> str:
        """The database that tuning in the model's own processes writes (``db_url``, else the default)."""
        from ..storage import default_url

        return self.db_url or default_url()

    def table_sources(self) -> TableSources:
        """This config's table settings, ``tables`` as strings; with ``tune_misses`` the tuning database is
        a source (the winners tuned at first calls are served from it)."""
        own = {f.name: getattr(self, f.name) for f in fields(TableSources)}
        if not isinstance(self.tables, str):  # a single string is refused by validate(), by name
            own["tables"] = tuple(str(p) for p in self.tables)
        own["db_url"] = self.tuning_db_url() if self.tune_misses is not None else self.db_url
        return TableSources(**own)


class Plan:
    """What the hot path needs for one call signature: ``run(workspace, inputs, ctx, out)`` and its state.

    ``layout`` is the layout the plan was made for: the hot index finds a plan by op, shapes, strides and
    dtypes, and the call's layout must equal it (else the full signature decides). ``run`` copies inputs
    into a layout the variants read first where the signature needs it. ``saving`` is the decision that
    serves calls needing what backward keeps (:func:`~.lookup.saving_decision`: the winner itself when it
    hands that out, else the fastest form that does); ``run_saving(inputs)`` returns ``(output, saved)``
    through it (its workspace prepared on first use). Calls are counted per path and variant for
    :func:`autotaxer.served`: ``calls`` counts the hot path's (plain dispatch without grad, the winner),
    ``served`` every other call by ``(path, variant)``.
    """

    __slots__ = (
        "run", "workspace", "ctx", "key", "decision", "layout", "calls", "last_used", "variant", "opobj",
        "saving", "served", "_saving",
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
        self._saving: Any = None  # (variant, workspace) that hands out what backward needs

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
            self._saving = self._saving_form(self.saving)
        variant, ws = self._saving
        result = variant.run_for_backward(ws, tensors, self.ctx)
        if result is None:  # a variant that declared it saves but could not this time: the baseline's
            base = self.opobj.baseline()
            params = base.default_params(self.key, self.ctx.target)
            self._saving = self._saving_form(Decision(base.name, params))
            variant, ws = self._saving
            result = variant.run_for_backward(ws, tensors, self.ctx)
            if result is None:
                raise NotImplementedError(f"{self.key.op}: no variant supports autograd")
        self.count(path, variant.name)
        return result

    def _saving_form(self, decision: Decision) -> tuple[Any, Any]:
        """``(variant, workspace)`` of ``decision`` (the winner's own workspace where it is the winner)."""
        if decision.variant == self.decision.variant and dict(decision.params) == dict(self.decision.params):
            return self.variant, self.workspace
        variant = self.opobj.variants[decision.variant]
        return variant, variant.prepare(self.key, dict(decision.params), self.ctx)


def _canonicalizing(run: Any, opobj: Any) -> Any:
    """``run`` with the inputs first copied to a layout every variant reads (:meth:`Op.canonical_inputs`)."""

    def run_canonical(ws: Any, tensors: tuple, ctx: Any, out: Any = None) -> Any:
        return run(ws, opobj.canonical_inputs(tensors), ctx, out)

    return run_canonical


# -- problem keys from tensors ----------------------------------------------------------------------
def problem_key(
    op: Any, tensors: tuple, layout: dict[str, Any], world_size: int, target: Target
) -> ProblemKey:
    """The problem key of a call; ``ValueError`` naming the field for bad inputs or layout."""
    full = op.layout_defaults()
    for name, value in layout.items():
        if name in op.derived_layout:
            raise ValueError(f"{name}: decided by the tensors' strides, not an argument of dispatch")
        if name not in op.layout_choices:
            known = ", ".join(n for n in op.layout_choices if n not in op.derived_layout) or "none"
            raise ValueError(f"{name}: not a layout field of {op.name} (known: {known})")
        if value not in op.layout_choices[name]:
            raise ValueError(f"{name}: must be one of {op.layout_choices[name]}, got {value!r}")
        full[name] = int(value)
    key = op.key_from_inputs(tensors, full, world_size, target.gpu_model)
    op.validate(key)
    return key


# -- the runtime ------------------------------------------------------------------------------------
class Runtime:
    """Dispatch state of one process group: context, agreed table, plans, workspaces and misses.

    Construction is cheap and local; the first :meth:`dispatch` (or :meth:`load`) sets up the device
    context and loads the table, collectively on every rank of ``group``.
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
        self._inline: Any = None  # tunes a miss at its first call (RuntimeConfig.tune_misses)
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
        plan = None
        if len(tensors) == 2:
            x, y = tensors
            try:
                plan = self._hot.get((op, x.shape, x.stride(), x.dtype, y.shape, y.stride(), y.dtype))
            except AttributeError:  # not tensors: _find tells every rank which argument
                plan = None
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

    # -- set-up (collective, first call) -----------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.ctx.rank if self.ctx is not None else _group_rank(self.group)[0]

    @property
    def world_size(self) -> int:
        return self.ctx.world_size if self.ctx is not None else _group_rank(self.group)[1]

    def load(self, device: Any = None) -> Table:
        """Set up the context for ``device`` (default: the current CUDA device, else CPU) and load the table.

        Collective. Every rank loads its sources; if their digests differ, rank 0's table is used by all
        (with a warning); if any rank fails to load, every rank raises :class:`ConsensusError`.
        """
        if self.table is not None:
            return self.table
        self._setup_context(device)
        self.table = self._agreed_table()
        return self.table

    def _setup_context(self, device: Any) -> None:
        from .._target import cpu_target, cuda_target
        from ..ops import RunContext

        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda":
            from ..ops._iris_heap import configure_iris_environment

            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            configure_iris_environment()
            target = cuda_target(device.index)
        else:
            target = cpu_target()
        rank, world_size = _group_rank(self.group)
        self.ctx = RunContext(
            rank=rank,
            world_size=world_size,
            device=device,
            target=target,
            group=self.group,
            heap_size=self.config.heap_size,
            peer_timeout_s=self.config.peer_timeout(),
            first_call_timeout_s=self.config.first_call_timeout_s,
        )
        self._watch = peer_watch(device)

    def _agreed_table(self) -> Table:
        cfg = self.config.table_sources()
        target = self.ctx.target
        table, error, exc = None, None, None
        try:
            table = load_table(cfg, target)
        except Exception as e:  # reported on every rank below, so no rank waits forever
            error, exc = f"{type(e).__name__}: {e}", e
        if self.ctx.world_size == 1:
            if exc is not None:
                raise exc
            return table
        mine = (table.digest if table is not None else None, error)
        everyone = _all_gather(mine, self.group)
        failed = [(r, err) for r, (_, err) in enumerate(everyone) if err is not None]
        if failed:
            lines = "; ".join(f"rank {r}: {err}" for r, err in failed)
            raise ConsensusError(f"dispatch: loading the tuning table failed ({lines})") from exc
        digests = {d for d, _ in everyone}
        if len(digests) == 1:
            return table
        self._warn_once(
            "table",
            f"autotaxer: ranks loaded different tuning tables ({len(digests)} distinct); using rank 0's",
        )
        payload = [r.to_dict() for r in table.records.values()] if self.ctx.rank == 0 else None
        payload = _broadcast(payload, self.group)
        if self.ctx.rank == 0:
            return table
        from ..records import WinnerRecord

        recs = [WinnerRecord.from_dict(d, where=f"rank 0's table record {i}") for i, d in enumerate(payload)]
        return merge([("rank 0's table", recs)], target, env={}, strict=False)

    # -- slow path: a new call signature -----------------------------------------------------------
    def _new_plan(self, sig: tuple, op: str, tensors: tuple, layout: dict[str, int]) -> Plan:
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
        run = _canonicalizing(variant.run, opobj) if opobj.needs_canonical(tensors) else variant.run
        saving = self._saving_decision(opobj, key, decision)
        plan = Plan(run, ws, self.ctx, key, decision, layout, variant, opobj, saving)
        plan.last_used = next(self._clock)  # newest: never the one evicted to make room for itself
        self._plans[sig] = plan
        self._evict()
        return plan

    def decide_call(
        self, op: str, tensors: tuple, layout: dict[str, Any], device: Any = None, keep: bool = False
    ) -> Decision:
        """The decision a call with tensors of these shapes, strides and dtypes gets (``tensors`` may be on
        the meta device; ``device`` is where the call runs): the first call of a shape decides the same,
        but this prepares no workspace. ``keep``: the decision serving such calls that need what backward
        keeps (``Plan.saving``). Collective, like the first call of a shape."""
        from ..ops import get_op

        if self.table is None:
            self.load(device)
        opobj = get_op(op)
        key, decision = self._decide(opobj, tensors, layout, tracing=True)
        self._traced.add(key)
        return self._saving_decision(opobj, key, decision) if keep else decision

    def note_traced(self, op: str, tensors: tuple, layout: dict[str, Any], variant: str) -> None:
        """Note that ``torch.compile`` traced a call of these shapes as ``variant`` in plain PyTorch (the
        graph runs it without autotaxer, so its calls are not counted: :func:`autotaxer.served` lists
        the key with the number of traces instead)."""
        from ..ops import get_op

        key = problem_key(get_op(op), tensors, dict(layout), self.ctx.world_size, self.ctx.target)
        self._traced_forms[(key, variant)] = self._traced_forms.get((key, variant), 0) + 1

    def _saving_decision(self, opobj: Any, key: ProblemKey, decision: Decision) -> Decision:
        """What serves ``key``'s calls that need what backward keeps (:func:`.lookup.saving_decision`)."""
        max_log = math.log(self.config.max_m_ratio)
        return saving_decision(self.table.records, key, decision, opobj, self.ctx.target, max_log)

    def _decide(
        self, opobj: Any, tensors: tuple, layout: dict[str, Any], tracing: bool = False
    ) -> tuple[ProblemKey, Decision]:
        """The key of a call and the decision every rank agreed on (a miss is noted; with ``tune_misses``
        tuned, unless ``torch.compile`` is ``tracing``: no trial runs inside a trace); collective."""
        key, decision, error, exc = None, None, None, None
        grad = _grad_inputs(tensors)
        try:
            key = problem_key(opobj, tensors, dict(layout), self.ctx.world_size, self.ctx.target)
            decision = self._decisions.get(key)
            if decision is None:
                decision = decide(
                    self.table.records,
                    key,
                    opobj,
                    self.ctx.target,
                    math.log(self.config.max_m_ratio),
                    self.config.min_nearest_speedup,
                )
            if self._watch.is_failed(opobj.name, decision.variant, key.text):  # a wait of it gave up here
                base = opobj.baseline()
                decision = Decision(base.name, base.default_params(key, self.ctx.target), FALLBACK, math.inf)
        except (KeyError, ValueError) as e:
            error, exc = f"{type(e).__name__}: {e}", e
        if self.ctx.world_size > 1:
            decision = self._agree(opobj.name, key, decision, error, exc, grad)
        elif exc is not None:
            raise exc
        recorder = current_recorder()
        if recorder is not None:  # a warm-up's recording step: misses are served BSP and noted
            decision = recorder.note(self, opobj, key, decision)
        elif decision.is_miss and self.config.tune_misses is not None and not tracing:
            decision = self._tune_inline(opobj, key, decision)
        self._decisions[key] = decision
        if decision.is_miss:
            self._note_miss(key, decision)
        return key, decision

    def _agree(self, op: str, key, decision, error, exc, grad: tuple = ()) -> Decision:
        """All ranks exchange (key, decision, which inputs require grad, the wrapper's arguments:
        :mod:`.agreement`); raise on every rank or resolve to one decision."""
        from ..ops import get_op
        from .agreement import caller

        mine = (key.text if key is not None else None, decision.digest if decision else None, error, grad)
        what = f"dispatch({op!r}) first call of {key.text if key is not None else 'a refused call'}"
        everyone = exchange("dispatch", what, (mine, caller()), self.group, self.config.agree_timeout_s)
        callers = [c for _, c in everyone]
        everyone = [m for m, _ in everyone]
        failed = [(r, e) for r, (_, _, e, _) in enumerate(everyone) if e is not None]
        if failed:
            lines = "; ".join(f"rank {r}: {e}" for r, e in failed)
            raise ConsensusError(f"dispatch({op!r}) failed ({lines})") from exc
        if len({k for k, _, _, _ in everyone}) > 1:
            lines = "; ".join(f"rank {r}: {k}" for r, (k, _, _, _) in enumerate(everyone))
            raise ConsensusError(f"dispatch({op!r}): ranks called with different problems ({lines})")
        if len(set(callers)) > 1:
            lines = "; ".join(f"rank {r}: {_caller_text(c)}" for r, c in enumerate(callers))
            raise ConsensusError(
                f"dispatch({op!r}): ranks called with different arguments for one problem ({lines}); "
                "the results would differ"
            )
        if len({g for _, _, _, g in everyone}) > 1:
            lines = ", ".join(f"rank {r}: {_grad_text(g)}" for r, (_, _, _, g) in enumerate(everyone))
            raise ConsensusError(
                f"dispatch({op!r}): ranks differ in which inputs require grad under grad mode ({lines}); "
                "backward is collective, so every rank must differentiate the same calls in the same inputs"
            )
        if len({d for _, d, _, _ in everyone}) == 1:
            return decision
        # A rank-local difference (variant unavailable on one rank, a record only one rank sees).
        self._warn_once(
            f"decision:{key.text}",
            f"autotaxer: ranks decided differently for {key.text}; using rank 0's decision if every rank "
            "can run it, else the baseline",
        )
        chosen = _broadcast(decision if self.ctx.rank == 0 else None, self.group)
        opobj = get_op(op)
        variant = opobj.available_variants(self.ctx.target).get(chosen.variant)
        usable = (
            variant is not None
            and variant.check(key, self.ctx.target, chosen.params) is None
            and not self._watch.is_failed(op, chosen.variant, key.text)
        )
        if all(_all_gather(usable, self.group)):
            return chosen
        base = opobj.baseline()
        return Decision(base.name, base.default_params(key, self.ctx.target), "fallback", math.inf, None)

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
            mine = _call_text(op, tensors, layout)
            everyone = _all_gather(mine, self.group)
            if len(set(everyone)) > 1:
                lines = "; ".join(f"rank {r}: {c}" for r, c in enumerate(everyone))
                raise ConsensusError(f"dispatch (check_calls): ranks called differently ({lines})")

    def _forget_failed(self) -> None:
        """Drop the plans and workspaces of (op, variant, key) whose waits on peers gave up: their flags
        and epochs no longer match the peers', and dispatch no longer serves them here."""
        failed = self._watch.failed
        if failed:
            self._drop_plans(lambda plan: (plan.key.op, plan.decision.variant, plan.key.text) in failed)

    def _drop_plans(self, doomed: Any, keep_workspaces: bool = False) -> None:
        """Drop every plan ``doomed(plan)`` is true of, with its hot entries and (unless
        ``keep_workspaces``) its workspace."""
        for sig, plan in list(self._plans.items()):
            if doomed(plan):
                del self._plans[sig]
                for hot in [h for h, p in self._hot.items() if p is plan]:
                    del self._hot[hot]
                self._count_calls(plan)
                if keep_workspaces:
                    continue
                for wkey, ws in list(self._workspaces.items()):
                    if ws is plan.workspace:
                        del self._workspaces[wkey]

    # -- tuning in the model's processes (autotaxer.warmup, tune_misses) ----------------------------
    def forget(self, keys: Any) -> None:
        """Decide ``keys`` again at their next call (their decisions, plans and workspaces are dropped).
        Every rank must forget the same keys: the next call's decision is agreed again."""
        keys = set(keys)
        for key in keys:
            self._decisions.pop(key, None)
        self._drop_plans(lambda plan: plan.key in keys)
        for wkey in [w for w in self._workspaces if w[0] in keys]:  # kept by serve_decision() for no plan
            del self._workspaces[wkey]

    def serve_decision(self, key: ProblemKey, decision: Decision) -> None:
        """Serve ``decision`` for ``key`` from its next call, keeping the workspaces prepared for the key
        (``autotaxer.warmup``'s in-step check switches a key between its winner and its fastest form;
        :meth:`forget` drops them). Every rank must serve the same: the next call agrees on it again."""
        self._decisions[key] = decision
        self._drop_plans(lambda plan: plan.key == key, keep_workspaces=True)

    def install_records(self, records: Any, origin: str) -> None:
        """Serve ``records`` (winners tuned in this group, the same on every rank) from their keys' next
        call: they join the table as records of ``origin`` and their keys are forgotten."""
        from ..records import timing_of

        keys = []
        for rec in records:
            if self.config.timing is None or timing_of(rec.env) == self.config.timing:
                self.table.records[rec.key] = rec
                self.table.origins[rec.key] = origin
                keys.append(rec.key)
        self.forget(keys)

    def use_database(self, url: str) -> None:
        """Make ``url`` this runtime's database (a table source below explicit tables); collective. When
        the table changes, every decision is made again."""
        import dataclasses

        if self.config.db_url == url and self.table is not None:
            return
        self.config = dataclasses.replace(self.config, db_url=url)
        if self.table is None:
            return
        old = self.table.digest
        self.table = self._agreed_table()
        if self.table.digest != old:
            self.forget(set(self._decisions) | {p.key for p in self._plans.values()})

    def has_decision(self, key: ProblemKey) -> bool:
        """Whether ``key`` has a cached decision (decided, and not forgotten since)."""
        return key in self._decisions

    def traced(self, key: ProblemKey) -> bool:
        """Whether ``key`` was decided while ``torch.compile`` traced (a graph may hold that decision)."""
        return key in self._traced

    def decide_key(self, key: ProblemKey) -> Decision:
        """The decision ``key`` gets from this runtime's table now (local: nothing agreed or cached)."""
        from ..ops import get_op

        return decide(
            self.table.records, key, get_op(key.op), self.ctx.target, math.log(self.config.max_m_ratio),
            self.config.min_nearest_speedup,
        )  # fmt: skip

    def decided_keys(self) -> list[ProblemKey]:
        """Every key decided so far (by a first call, or while ``torch.compile`` traced)."""
        return list(self._decisions)

    def _tune_inline(self, opobj: Any, key: ProblemKey, decision: Decision) -> Decision:
        """``tune_misses``: tune ``key`` now, every rank taking part, and decide it again; collective."""
        from ..tuner.in_group import InlineTuner  # the one upward import (tests/test_layers.py)

        if self._inline is None:
            self._inline = InlineTuner(self.config)
        return self.decide_key(key) if self._inline.tune(self, key) else decision

    def _refuse(self, op: str, error: str | Exception) -> NoReturn:
        """Raise for a call whose arguments are not what dispatch (or a wrapper over it) takes, on every
        rank: the others learn it in the exchange of a first call, where they would otherwise wait for
        this one. ``error``: a message (a ``TypeError`` of dispatch's) or the wrapper's exception."""
        exc = error if isinstance(error, Exception) else TypeError(f"dispatch({op!r}): {error}")
        text = f"TypeError: {error}" if isinstance(error, str) else f"{type(exc).__name__}: {exc}"
        if self.world_size > 1:
            if self.table is None:
                self.load()
            self._agree(op, None, None, text, exc)
        raise exc

    def _workspace(self, variant: Any, key: ProblemKey, decision: Decision) -> Any:
        import json

        wkey = (key, variant.name, json.dumps(dict(decision.params), sort_keys=True, default=str))
        ws = self._workspaces.get(wkey)
        if ws is None:
            ws = variant.prepare(key, dict(decision.params), self.ctx)
            self._workspaces[wkey] = ws
        return ws

    def _evict(self) -> None:
        while len(self._plans) > self.config.workspace_cache:
            lru = min(self._plans, key=lambda sig: self._plans[sig].last_used)
            old = self._plans.pop(lru)
            for hot in [h for h, p in self._hot.items() if p is old]:
                del self._hot[hot]
            self._count_calls(old)
            if not any(p.workspace is old.workspace for p in self._plans.values()):
                for wkey, ws in list(self._workspaces.items()):
                    if ws is old.workspace:
                        del self._workspaces[wkey]

    # -- misses ------------------------------------------------------------------------------------
    def _note_miss(self, key: ProblemKey, decision: Decision) -> None:
        if key in self._misses:
            return
        tuned = decision.tuned_key.text if decision.tuned_key is not None else None
        self._misses[key] = Miss(key, decision.source, decision.variant, 0, tuned)
        _log.info(
            "autotaxer dispatch miss: %s -> %s %s (%s)",
            key.text,
            decision.variant,
            dict(decision.params),
            f"nearest {tuned}" if tuned else "no tuned record",
        )

    def _count_calls(self, plan: Plan) -> None:
        """Move ``plan``'s call counts into the runtime's (its miss, and :meth:`served_calls`)."""
        m = self._misses.get(plan.key)
        if m is not None:
            self._misses[plan.key] = Miss(
                m.key, m.source, m.variant, m.calls + plan.total_calls(), m.tuned_key
            )
        for (path, variant), n in _plan_counts(plan).items():
            before, _ = self._served_before.get((plan.key, path, variant), (0, None))
            self._served_before[(plan.key, path, variant)] = (before + n, plan.decision)
        plan.calls = 0
        plan.served = {}

    def served_calls(self) -> list[tuple[ProblemKey, str, str, int | None, Decision | None]]:
        """``(key, path, variant, calls, decision)`` of every call served so far (``calls`` None: traced
        into a compiled graph as plain PyTorch, whose calls nobody counts; the number of traces is
        :meth:`traces`); ``decision`` the key's decision when those calls were served."""
        counts = {k: (n, d) for k, (n, d) in self._served_before.items()}
        for plan in self._plans.values():
            for (path, variant), n in _plan_counts(plan).items():
                before, _ = counts.get((plan.key, path, variant), (0, None))
                counts[(plan.key, path, variant)] = (before + n, plan.decision)
        rows: list[tuple[ProblemKey, str, str, int | None, Decision | None]] = [
            (key, path, variant, n, d) for (key, path, variant), (n, d) in counts.items()
        ]
        for key, variant in self._traced_forms:
            rows.append((key, "traced", variant, None, self._decisions.get(key)))
        return rows

    def traces(self, key: ProblemKey, variant: str) -> int:
        """How many times ``torch.compile`` traced ``key`` as ``variant`` in plain PyTorch."""
        return self._traced_forms.get((key, variant), 0)

    def misses(self) -> list[Miss]:
        """Distinct misses so far with their call counts, most called first."""
        live: dict[ProblemKey, int] = {}
        for p in self._plans.values():
            live[p.key] = live.get(p.key, 0) + p.total_calls()
        out = [
            Miss(m.key, m.source, m.variant, m.calls + live.get(m.key, 0), m.tuned_key)
            for m in self._misses.values()
        ]
        return sorted(out, key=lambda m: (-m.calls, m.key.text))

    def decisions(self) -> dict[ProblemKey, Decision]:
        """The decision of every cached call signature, by problem key."""
        return {p.key: p.decision for p in self._plans.values()}

    def _persist_misses(self) -> None:
        if self._misses_path is None or not self._misses:
            return
        if self.ctx is not None and self.ctx.rank != 0:
            return
        try:
            append_misses(self.misses(), self._misses_path)
        except OSError as e:
            warnings.warn(f"autotaxer: could not write misses to {self._misses_path}: {e}", stacklevel=1)

    def close(self) -> None:
        """Persist misses (rank 0) and drop plans and workspaces."""
        if self._closed:
            return
        for p in self._plans.values():
            self._count_calls(p)
        self._persist_misses()
        self._plans.clear()
        self._hot.clear()
        self._workspaces.clear()
        self._decisions.clear()
        self._closed = True
        atexit.unregister(self._persist_misses)

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _plan_counts(plan: Plan) -> dict[tuple[str, str], int]:
    """``(path, variant) -> calls`` of ``plan``: its hot path's (plain dispatch, the winner) and the rest."""
    counts = {k: n for k, n in plan.served.items() if n}
    if plan.calls:
        key = ("dispatch", plan.decision.variant)
        counts[key] = counts.get(key, 0) + plan.calls
    return counts


def _argument_error(tensors: tuple) -> str | None:
    """Why these are not dispatch's tensor arguments (``None`` when they are)."""
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            return f"tensor argument {i + 1}: expected a torch.Tensor, got {type(t).__name__}"
    return None


def _grad_inputs(tensors: tuple) -> tuple[int, ...]:
    """Which tensor arguments (by position) require grad under grad mode: what backward will need."""
    if not torch.is_grad_enabled():
        return ()
    return tuple(i for i, t in enumerate(tensors) if getattr(t, "requires_grad", False))


def _grad_text(grad: tuple[int, ...]) -> str:
    return "tensor arguments " + ", ".join(str(i + 1) for i in grad) if grad else "none"


def _caller_text(caller: tuple | None) -> str:
    return "dispatch itself" if caller is None else ", ".join(str(a) for a in caller)


def _call_text(op: str, tensors: tuple, layout: dict[str, Any]) -> str:
    """One call's signature as text (``check_calls``): op, each tensor's shape, strides, dtype and
    ``requires_grad``, the layout and grad mode."""
    parts = [op]
    for t in tensors:
        if isinstance(t, torch.Tensor):
            grad = " requires_grad" if t.requires_grad else ""
            parts.append(f"{tuple(t.shape)} strides {t.stride()} {str(t.dtype).removeprefix('torch.')}{grad}")
        else:
            parts.append(type(t).__name__)
    parts += [f"{k}={v}" for k, v in sorted(layout.items())]
    parts.append("grad mode" if torch.is_grad_enabled() else "no grad")
    return ", ".join(parts)


# -- collectives helpers (off the hot path) ---------------------------------------------------------
def _group_rank(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise RuntimeError("dispatch: a process group was given but torch.distributed is not initialized")
    return 0, 1


def _all_gather(obj: Any, group: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _broadcast(obj: Any, group: Any) -> Any:
    import torch.distributed as dist

    src = 0 if group is None else dist.get_global_rank(group, 0)
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


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
