"""How a runtime decides what serves each problem key: the key of a call, the decision every rank agreed
on, and tuning in the model's processes changing it (:class:`KeyDecisions`).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from .._problem import ProblemKey, Target
from ._runtimes import current_recorder
from .lookup import FALLBACK, Decision, decide, saving_decision


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


class MissTuner(Protocol):
    """What ``RuntimeConfig(tune_misses=...)`` tunes a miss with, every rank of the group taking part
    (:class:`autotaxer.tuner.in_group.InlineTuner`, which the package's ``_miss_tuner`` makes)."""

    def tune(self, rt: Any, key: ProblemKey) -> bool:
        """Tune ``key`` now on every rank of ``rt``'s group; True when the table has a winner for it."""
        ...


class KeyDecisions:
    """What each problem key of :class:`~autotaxer.runtime.dispatch.Runtime` (whose ``__init__`` makes the
    state) is served: decided from the table at its first call (:func:`.lookup.decide`), agreed by every
    rank, noted as a miss or tuned (``tune_misses``), recorded by a warm-up; decided again once forgotten
    (tuning in the model's processes: ``autotaxer.warmup``, ``tune_misses``)."""

    config: Any
    ctx: Any
    table: Any
    _decisions: dict[ProblemKey, Decision]  # agreed by every rank; one per key
    _traced: set[ProblemKey]
    _traced_forms: dict[tuple[ProblemKey, str], int]
    _inline: MissTuner | None

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

    def forget(self, keys: Any) -> None:
        """Decide ``keys`` again at their next call (their decisions, plans and workspaces are dropped).
        Every rank must forget the same keys: the next call's decision is agreed again."""
        keys = set(keys)
        for key in keys:
            self._decisions.pop(key, None)
        self._drop_plans(lambda plan: plan.key in keys)
        for wkey in [w for w in self._workspaces if w[0] in keys]:  # kept by serve_decision() for no plan
            del self._workspaces[wkey]
        self._prune_launchers()

    def serve_decision(self, key: ProblemKey, decision: Decision) -> None:
        """Serve ``decision`` for ``key`` from its next call, keeping the workspaces prepared for the key
        (``autotaxer.warmup``'s in-step check switches a key between its winner and its fastest form;
        :meth:`forget` drops them). Every rank must serve the same: the next call agrees on it again."""
        self._decisions[key] = decision
        self._drop_plans(lambda plan: plan.key == key, keep_workspaces=True)

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
        if self._inline is None:
            from .. import _miss_tuner  # the package wires the tuner in: the runtime never imports it

            self._inline = _miss_tuner(self.config)
        return self.decide_key(key) if self._inline.tune(self, key) else decision


def _grad_inputs(tensors: tuple) -> tuple[int, ...]:
    """Which tensor arguments (by position) require grad under grad mode: what backward will need."""
    if not torch.is_grad_enabled():
        return ()
    return tuple(i for i, t in enumerate(tensors) if getattr(t, "requires_grad", False))
