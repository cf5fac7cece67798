"""The entries of one benchmark row timed side by side, once all are ready (:class:`RowTimings`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .case import BenchConfig


class RowTimings:
    """The entries of one row waiting to be timed side by side.

    ``add`` registers an entry (its result dict) with the callable to time and its chain (None: back to
    back); ``run`` times them all with :func:`autotaxer.measure.time_interleaved` (one sample of each in
    turn, every mode of ``cfg``) and writes each one's times into its dict. Collective.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[dict[str, Any], Callable[[], Any], Any]] = []

    def add(self, entry: dict[str, Any], fn: Callable[[], Any], chain: Any = None) -> dict[str, Any]:
        """Time ``fn`` into ``entry`` at the next :meth:`run`, its calls linked by ``chain`` (a
        :class:`autotaxer.measure.Chain`, or None); returns ``entry``."""
        self._pending.append((entry, fn, chain))
        return entry

    def run(self, ctx: Any, cfg: BenchConfig) -> None:
        """Time every registered entry (collective); afterwards none is pending."""
        from ..measure import time_interleaved

        if not self._pending:
            return
        fns = [fn for _, fn, _ in self._pending]
        chains = [chain for _, _, chain in self._pending]
        times = time_interleaved(
            fns, ctx, cfg.modes, warmup=cfg.warmup, iters=cfg.iters, samples=cfg.samples, chains=chains
        )
        for (entry, _, _), t in zip(self._pending, times, strict=True):
            entry.update(t)
        self._pending.clear()
