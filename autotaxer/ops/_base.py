"""The contract between ops, their variants, the tuner and dispatch.

An :class:`Op` (e.g. ``ag_gemm``) knows its problem shape, how to make each rank's inputs from a seed,
and the fp32 reference each rank must produce. A :class:`Variant` is one way to compute the op (``bsp``,
``pull``, ``push``, ...): it declares a search space as data, prunes impossible parameter combinations
without launching, and is split into ``prepare`` (allocates; returns a :class:`Workspace`) and ``run``
(the hot path: launches only).

Every call of ``prepare``/``run`` is collective: all ranks of ``ctx.group`` call it with the same key
and parameters.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._problem import ProblemKey, Target

Params = Mapping[str, Any]


def _timeout_from_env() -> float:
    from autotaxer.kernels.common.watch import timeout_from_env

    return timeout_from_env()


@dataclass
class RunContext:
    """Where a variant runs: this rank, its group and device, and the lazily created Iris heap.

    ``peer_timeout_s``: how long a kernel's wait on a peer's flag may spin before it gives up and the host
    raises ``PeerTimeoutError`` (default ``$AUTOTAXER_PEER_TIMEOUT``, else 5 s); ``first_call_timeout_s``
    the longer bound of a workspace's first call (ranks may still be compiling)."""

    rank: int
    world_size: int
    device: Any  # torch.device
    target: Target
    group: Any = None  # torch.distributed.ProcessGroup; None = the default group
    heap_size: int = 1 << 30
    _iris: Any = field(default=None, repr=False)
    peer_timeout_s: float = field(default_factory=_timeout_from_env)
    first_call_timeout_s: float = 30.0

    def watch_slot(self, key: ProblemKey, variant: str) -> Any:
        """A watch slot for ``variant`` at ``key`` (``kernels/common/watch.py``): the kernels' waits on peers
        give up after ``peer_timeout_s`` and the host names this site. Keep the returned object alive as
        long as the kernels use its ``tensor``."""
        from ._peer_wait import Site, peer_watch

        site = Site(key.op, variant, key.text, self.rank, self.world_size)
        return peer_watch(self.device).open(site, self.peer_timeout_s, self.first_call_timeout_s)

    #: Set by :func:`autotaxer.measure.warm_up` once this rank's process has been warmed up for timing.
    warmed_up: bool = field(default=False, repr=False)

    def iris(self):
        """The process's Iris context (symmetric heap), created on first use."""
        if self._iris is None:
            from ._iris_heap import get_iris

            self._iris = get_iris(self.heap_size)
        return self._iris


@dataclass
class Workspace:
    """What ``prepare`` allocated for one (key, params); ``run`` allocates nothing."""

    key: ProblemKey
    params: dict[str, Any]
    buffers: dict[str, Any] = field(default_factory=dict)

    def matches(self, key: ProblemKey, params: Params) -> bool:
        """True when this workspace can serve ``key`` with ``params`` without reallocating."""
        return self.key == key and self.params == dict(params)


class Variant(ABC):
    """One implementation of an op, with its search space."""

    #: Registry name, e.g. ``"bsp"``.
    name: ClassVar[str]
    #: Device types the variant runs on: ``{"cuda"}``, ``{"cpu"}`` or both.
    device_types: ClassVar[frozenset[str]] = frozenset({"cuda"})
    #: True for the baseline: the BSP form every tuning starts with (default parameters).
    is_baseline: ClassVar[bool] = False
    #: True for every bulk-synchronous form (the baseline and its stronger alternatives users can have,
    #: e.g. NCCL's symmetric-memory collectives): a speedup is against the fastest of them.
    bsp_form: ClassVar[bool] = False
    #: A form users have without autotaxer (every BSP form; torch's own fused ops): dispatch may serve an
    #: untuned key the fastest of them measured at its nearest tuned key (``fastest_form`` of a record).
    fallback_form: ClassVar[bool] = False
    #: Opt-in (not measured on, or not a winner on, the hardware it targets): tuned and benchmarked only
    #: when named explicitly (``--variants``); dispatch still runs it where a table record names it.
    experimental: ClassVar[bool] = False

    def unavailable_reason(self, target: Target) -> str | None:
        """Why this variant cannot run on ``target`` at all (missing Iris, wrong vendor), or None."""
        if target.device_type not in self.device_types:
            return f"{self.name} runs on {sorted(self.device_types)}, not {target.device_type}"
        return None

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        """Categorical choices per parameter. Empty for a variant without parameters."""
        return {}

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        """Why ``params`` cannot work for ``key`` on ``target`` (pruned before any launch), or None."""
        return None

    def default_params(self, key: ProblemKey, target: Target) -> dict[str, Any]:
        """A safe configuration: the first valid combination of the search space, in declaration order."""
        space = self.search_space(key, target)
        for params in iter_grid(space):
            if self.check(key, target, params) is None:
                return params
        raise ValueError(f"{self.name}: no valid configuration for {key.text}")

    def complete_params(self, params: Params) -> dict[str, Any]:
        """``params`` of a record tuned before parameters were added, completed with the values that give
        the code it ran (the tuner's warm start takes earlier winners through this)."""
        return dict(params)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Configurations known to be good for ``key``, tried first by the tuner and the benchmark.

        Each must use only values listed in :meth:`search_space`; invalid ones are skipped by the
        callers. The default is none: the sampler starts from scratch.
        """
        return []

    @abstractmethod
    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        """Allocate everything ``run`` needs (buffers, flags, compiled kernels)."""

    @abstractmethod
    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        """Compute the op on this rank's ``inputs``; collective. Returns the output tensor: ``out`` when
        given, else a fresh tensor that no later call writes (never a workspace buffer)."""

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(output, saved)``, both fresh tensors, where ``saved`` is what the op's backward needs that
        the forward communicated (``ag_gemm``: the gathered A), so backward never communicates it again;
        ``None`` when this variant cannot hand it out (autograd then runs the baseline's)."""
        return None

    def saves_for_backward(self) -> bool:
        """Whether :meth:`run_for_backward` hands out what backward keeps (else autograd runs the
        baseline's forward in its place): by default, whether the variant overrides it. A variant whose
        override can return None says False here (the experimental ``push_ws`` family does not yet: its
        shipped records are hashed with its source; its calls that need the gathered A run the baseline)."""
        return type(self).run_for_backward is not Variant.run_for_backward


class Op(ABC):
    """A tunable collective operation: its problem (key fields, inputs, reference), its variants, and
    the integrations it takes part in (:mod:`._forms`), which the runtime, the commands, the benchmark
    and the layers find here instead of naming ops (their forms: :func:`autotaxer.integrations.form`)."""

    name: ClassVar[str]
    #: Shape fields in key order, e.g. ``("M", "N", "K")``.
    shape_fields: ClassVar[tuple[str, ...]]
    #: Layout fields with defaults and allowed values, e.g. ``{"gather_dim": (0, 1)}``.
    layout_choices: ClassVar[dict[str, tuple[Any, ...]]] = {}
    #: Layout fields that a call's tensors decide (not keyword arguments of dispatch).
    derived_layout: ClassVar[frozenset[str]] = frozenset()
    # An op declares the six below as class attributes, or its package sets them on its instance (where
    # the op's module is in its records' kernel hash, so that adding them changed no record).
    #: The integrations it takes part in (kinds of :data:`._forms.INTEGRATION_KINDS`).
    integrations: ClassVar[Collection[str]] = frozenset()
    #: Variants whose host code decides nothing that differs from call to call (flags, epochs and tokens on
    #: the device): their calls are launched as CUDA-graph replays (:mod:`autotaxer.runtime.replay`).
    replayed: ClassVar[Collection[str]] = frozenset()
    #: Kind -> the form it carries itself, of those integrations whose form needs nothing above the ops
    #: (the emulated checks; a bench row's parts for an op outside the package); the integration layer
    #: holds the others (:mod:`autotaxer.integrations`).
    forms: ClassVar[Mapping[str, Any]] = {}
    #: Names of the functions of :mod:`autotaxer.functional` its ``functions`` integration provides.
    function_names: ClassVar[tuple[str, ...]] = ()
    #: The tensor-parallel linear layer it can serve (:class:`._forms.LayerForm`), or None.
    layer: ClassVar[Any] = None
    #: ``flops(key)``: arithmetic one rank does for ``key`` (the commands' CPU run-time estimates), or None.
    flops: ClassVar[Any] = None

    def __init__(self) -> None:
        self._variants: dict[str, Variant] = {}
        #: Variants whose tuned configuration holds only at the size it was tuned at (the first shape
        #: field: M for ag_gemm): dispatch's nearest-size lookup never reuses them at another size.
        self.tied_to_size: frozenset[str] = frozenset()
        #: Experimental variants that the tuner's default space (no ``--variants``) holds from a world
        #: size on: those that a run at that size is to measure before they are kept or retired.
        self.default_from_world_size: dict[str, int] = {}

    def call_layout(self) -> dict[str, Any]:
        """The layout fields a call passes as keywords of dispatch, with their defaults."""
        return {k: v for k, v in self.layout_defaults().items() if k not in self.derived_layout}

    def in_default_space(self, name: str, world_size: int) -> bool:
        """Whether the tuner tries variant ``name`` at ``world_size`` when no ``--variants`` is given."""
        if not self._variants[name].experimental:
            return True
        return world_size >= self.default_from_world_size.get(name, 1 << 30)

    # -- registry -------------------------------------------------------------------------------
    def register(self, variant: Variant) -> Variant:
        """Add a variant (last registration of a name wins)."""
        self._variants[variant.name] = variant
        return variant

    @property
    def variants(self) -> dict[str, Variant]:
        return dict(self._variants)

    def bsp_forms(self, target: Target | None = None) -> list[str]:
        """Names of the BSP forms (the baseline first), those available on ``target`` when given."""
        forms = [n for n, v in self._variants.items() if v.is_baseline or v.bsp_form]
        forms.sort(key=lambda n: not self._variants[n].is_baseline)
        if target is not None:
            forms = [n for n in forms if self._variants[n].unavailable_reason(target) is None]
        return forms

    def fallback_forms(self, target: Target | None = None) -> list[str]:
        """Names of the forms an untuned key may be served (the BSP forms, then the other forms users
        have without autotaxer), those available on ``target`` when given."""
        names = self.bsp_forms() + [
            n for n, v in self._variants.items() if v.fallback_form and not (v.is_baseline or v.bsp_form)
        ]
        if target is not None:
            names = [n for n in names if self._variants[n].unavailable_reason(target) is None]
        return names

    def baseline(self) -> Variant:
        for v in self._variants.values():
            if v.is_baseline:
                return v
        raise LookupError(f"{self.name}: no baseline variant registered")

    def available_variants(self, target: Target) -> dict[str, Variant]:
        return {n: v for n, v in self._variants.items() if v.unavailable_reason(target) is None}

    # -- problems -------------------------------------------------------------------------------
    def layout_defaults(self) -> dict[str, int]:
        return {k: v[0] for k, v in self.layout_choices.items()}

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, Any], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The problem key of a dispatch call with these tensors and (defaulted) layout."""
        raise ValueError(f"{self.name}: dispatch does not know how to build a problem key from its inputs")

    def canonical_inputs(self, tensors: tuple) -> tuple:
        """The inputs in a memory layout every variant reads (copies only what must change)."""
        return tensors

    def needs_canonical(self, tensors: tuple) -> bool:
        """True when :meth:`canonical_inputs` would copy one of ``tensors``."""
        return False

    @abstractmethod
    def validate(self, key: ProblemKey) -> None:
        """Raise ``ValueError`` naming the field when ``key`` is not a valid problem (e.g. divisibility)."""

    @abstractmethod
    def make_inputs(self, key: ProblemKey, rank: int, device: Any, seed: int) -> tuple[Any, ...]:
        """This rank's inputs, drawn from ``seed`` (random, never zeros)."""

    @abstractmethod
    def reference(self, key: ProblemKey, rank: int, device: Any, seed: int) -> Any:
        """The fp32 output that ``rank`` must produce for the inputs of ``make_inputs(seed)``."""

    @abstractmethod
    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        """An output tensor filled with NaN (so unwritten elements fail validation)."""

    def flops_per_rank(self, key: ProblemKey) -> float:
        """Arithmetic one rank does for ``key`` (for the commands' CPU run-time estimates), or 0 when it
        is negligible or unknown (no ``flops``)."""
        return float(self.flops(key)) if self.flops is not None else 0.0

    def bytes_per_rank(self, key: ProblemKey) -> int:
        """Device memory one rank needs for a trial of ``key`` (inputs, output, the fp32 reference), or 0
        when unknown; the tuner refuses a shape that cannot fit before it launches anything."""
        return 0

    def tolerance(self, key: ProblemKey) -> float:
        """Largest accepted ``||out-ref||/||ref||``."""
        return 1e-3 if key.dtype == "fp32" else 1e-2


def relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in fp64; ``inf`` when ``out`` has a NaN/inf or a wrong shape."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return math.inf
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if not torch.isfinite(o).all():
        return math.inf
    denom = torch.linalg.vector_norm(r).item()
    err = torch.linalg.vector_norm(o - r).item()
    return err / denom if denom > 0 else err


def iter_grid(space: Mapping[str, tuple[Any, ...]]):
    """Every combination of a categorical search space, in declaration order."""
    names = list(space)
    if not names:
        yield {}
        return

    def rec(i: int, acc: dict[str, Any]):
        if i == len(names):
            yield dict(acc)
            return
        for value in space[names[i]]:
            acc[names[i]] = value
            yield from rec(i + 1, acc)

    yield from rec(0, {})
