"""What a runtime served and what it missed: calls counted per problem key, call path and variant
(:func:`autotaxer.served`), the keys served without an exact tuned record (:mod:`.misses`, appended to
the misses file by rank 0 at close and at exit), and the runtime's close (:class:`CallCounts`).
"""

from __future__ import annotations

import atexit
import logging
import warnings
from typing import Any

from .._problem import ProblemKey
from .lookup import Decision
from .misses import Miss, append_misses

_log = logging.getLogger("autotaxer.dispatch")


class CallCounts:
    """The books of :class:`~autotaxer.runtime.dispatch.Runtime` (whose ``__init__`` makes the state):
    a plan counts its own calls (the hot path's ``plan.calls``, the rest in ``plan.served``); they move
    here when the plan is dropped (``_count_calls``) and are summed with the live plans' when asked."""

    ctx: Any
    _plans: dict[tuple, Any]
    _misses: dict[ProblemKey, Miss]
    #: calls of dropped plans: (key, path, variant) -> calls, with the decision that served them
    _served_before: dict[tuple[ProblemKey, str, str], tuple[int, Decision]]
    _misses_path: str | None
    _closed: bool

    def _note_miss(self, key: ProblemKey, decision: Decision) -> None:
        """Note ``key`` as a miss (served by a nearest record or the fallback), once, and log it."""
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

    def _count_calls(self, plan: Any) -> None:
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
        """Rank 0: append the misses to the misses file (``misses_path``); also run at exit."""
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
        self._launchers.clear()
        self._saving_launchers.clear()
        self._decisions.clear()
        self._closed = True
        atexit.unregister(self._persist_misses)


def _plan_counts(plan: Any) -> dict[tuple[str, str], int]:
    """``(path, variant) -> calls`` of ``plan``: its hot path's (plain dispatch, the winner) and the rest."""
    counts = {k: n for k, n in plan.served.items() if n}
    if plan.calls:
        key = ("dispatch", plan.decision.variant)
        counts[key] = counts.get(key, 0) + plan.calls
    return counts
