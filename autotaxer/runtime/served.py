"""What served the calls: per problem key and call path, which variant ran how many calls.

Every call of an op reaches autotaxer by one path: ``dispatch`` (:func:`autotaxer.dispatch` and the
:mod:`autotaxer.nn` layers, eager), ``function`` (``fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``, eager), ``compiled`` (their custom ops, run by code that ``torch.compile``
built), ``backward`` (a call made by another op's backward), ``async_tp`` (PyTorch's fused ops overridden
by :mod:`autotaxer.async_tp`). A key's calls are served by its winner (``decision``: the tuned variant, or
the form an untuned key gets) unless a call needs what backward keeps and the winner cannot hand it out;
then the fastest form that can serves it, and the row says ``fell back``. ``traced``: a BSP that
``torch.compile`` traced into the graph as plain PyTorch, which runs without autotaxer: its calls are not
counted (``calls`` is None) and ``traces`` says how many times it was traced.

Counting costs the hot path nothing it did not do before (the plan's call counter); the other paths add
one dictionary increment to calls that cost microseconds more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ._runtimes import RUNTIMES
from .lookup import FALLBACK

#: Call paths, in the order rows are listed.
PATHS = ("dispatch", "function", "compiled", "backward", "async_tp", "traced")


@dataclass(frozen=True)
class Served:
    """Calls of one problem key by one path served by one variant.

    ``key``: the problem key's text; ``path``: one of :data:`PATHS`; ``variant``: what ran; ``calls``: how
    many calls (None for ``traced``: nobody counts them); ``decision``: the key's decided variant and
    ``source`` where it came from (``exact``/``nearest``: tuned; ``fallback``: an untuned key's form);
    ``traces``: for ``traced``, how many times ``torch.compile`` traced it."""

    key: str
    path: str
    variant: str
    calls: int | None
    decision: str
    source: str
    traces: int = 0

    @property
    def status(self) -> str:
        """``tuned`` (the tuned winner ran), ``untuned`` (the key has no tuned winner: its fallback form
        ran), or ``fell back`` (the call needed what the winner cannot hand out: another form ran)."""
        if self.variant != self.decision:
            return "fell back"
        return "untuned" if self.source == FALLBACK else "tuned"

    def line(self) -> str:
        """One human line: key, path, variant, calls and status."""
        calls = f"traced {self.traces}x, calls not counted" if self.calls is None else f"{self.calls} calls"
        status = self.status
        if status == "tuned":
            status += f" ({self.source})"
        elif status == "fell back":
            status += f" (winner {self.decision}, {self.source})"
        return f"{self.key}  {self.path} {self.variant}: {calls}, {status}"

    def to_dict(self) -> dict:
        """A JSON-able dict of the row, with its ``status``."""
        return {
            "key": self.key, "path": self.path, "variant": self.variant, "calls": self.calls,
            "decision": self.decision, "source": self.source, "traces": self.traces, "status": self.status,
        }  # fmt: skip


def served(since: Iterable[Served] | None = None) -> list[Served]:
    """Per problem key and call path, which variant served how many calls in this process (every group's
    runtime), sorted by key, then path (:data:`PATHS` order), then variant.

    ``since``: an earlier result; only the calls made after it are counted (rows with none are left out),
    e.g. ``before = autotaxer.served(); step(); autotaxer.served(since=before)``."""
    rows: dict[tuple[str, str, str], Served] = {}
    for rt in list(RUNTIMES.values()):
        for key, path, variant, calls, decision in rt.served_calls():
            chosen = decision.variant if decision is not None else "?"
            source = decision.source if decision is not None else "?"
            traces = rt.traces(key, variant) if calls is None else 0
            where = (key.text, path, variant)
            old = rows.get(where)
            if old is not None and old.calls is not None and calls is not None:
                calls += old.calls
            rows[where] = Served(key.text, path, variant, calls, chosen, source, traces)
    if since is not None:
        before = {(r.key, r.path, r.variant): r for r in since}
        for where, row in list(rows.items()):
            old = before.get(where)
            if old is None:
                continue
            if row.calls is None:
                rows[where] = replace(row, traces=row.traces - old.traces)
            else:
                rows[where] = replace(row, calls=row.calls - (old.calls or 0))
        rows = {w: r for w, r in rows.items() if (r.calls if r.calls is not None else r.traces) > 0}
    order = {p: i for i, p in enumerate(PATHS)}
    return sorted(rows.values(), key=lambda r: (r.key, order.get(r.path, len(PATHS)), r.variant))


def format_served(rows: Iterable[Served]) -> str:
    """The rows of :func:`served` as text, one line each (``(nothing served)`` when there are none)."""
    lines = [r.line() for r in rows]
    return "\n".join(lines) if lines else "(nothing served)"
