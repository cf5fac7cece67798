"""A runtime's workspaces: each variant's ``prepare`` runs once per (key, variant, parameters), its
workspace is shared by the plans that use it and freed with the last of them (least recently used plans
beyond ``RuntimeConfig.workspace_cache`` are dropped) or when its key is forgotten or its waits on peers
gave up (:class:`Workspaces`). Each workspace's launchers (:func:`~.replay.launcher`, and
:func:`~.replay.saving_launcher` for the calls that keep what backward needs: their CUDA-graph replays,
where the variant is replayed) live as long as the workspace, so a key switched between its winner and its
fastest form (the in-step check) replays the graphs it captured before. (Until 2026-11-28 the saving calls'
launcher lived in the plan, which a switch drops: the check timed a capture in each round's step.)
"""

from __future__ import annotations

import json
from typing import Any

from .._problem import ProblemKey
from .lookup import Decision
from .replay import launcher, saving_launcher


class Workspaces:
    """The plan and workspace cache of :class:`~autotaxer.runtime.dispatch.Runtime` (whose ``__init__``
    makes the state): ``_workspaces`` maps (key, variant, parameters as JSON) to a workspace, ``_plans``
    a call's full signature to its plan and ``_hot`` a call's op, shapes, strides and dtypes to one of
    those plans (the hot path's index); ``_launchers`` a workspace's key to ``(workspace, launcher)``, and
    ``_saving_launchers`` to ``(workspace, launcher)`` of the calls that keep what backward needs."""

    config: Any
    ctx: Any
    _plans: dict[tuple, Any]
    _hot: dict[tuple, Any]
    _workspaces: dict[tuple, Any]
    _launchers: dict[tuple, tuple[Any, Any]]
    _saving_launchers: dict[tuple, tuple[Any, Any]]

    def _workspace(self, variant: Any, key: ProblemKey, decision: Decision) -> Any:
        """The workspace of ``variant`` with ``decision``'s parameters for ``key``: prepared on first use,
        then shared by every plan of the same (key, variant, parameters)."""
        wkey = _wkey(variant, key, decision)
        ws = self._workspaces.get(wkey)
        if ws is None:
            ws = variant.prepare(key, dict(decision.params), self.ctx)
            self._workspaces[wkey] = ws
        return ws

    def _launcher(self, opobj: Any, variant: Any, key: ProblemKey, decision: Decision, ws: Any) -> Any:
        """How the plans of workspace ``ws`` run ``variant`` (one launcher a workspace, graphs and all)."""
        name = f"{key.text} {variant.name}"
        return self._kept(self._launchers, variant, key, decision, ws,
                          lambda: launcher(opobj, variant, key, self.ctx.device, name=name))  # fmt: skip

    def _saving_form(self, opobj: Any, key: ProblemKey, decision: Decision) -> tuple[Any, Any, Any]:
        """``(variant, workspace, run)`` serving ``decision``'s calls of ``key`` that keep what backward
        needs (``run(ws, inputs, ctx) -> (output, saved)``: :func:`~.replay.saving_launcher`). The workspace
        and the launcher are kept per workspace like the plain calls', so a key switched between forms (the
        in-step check) replays the graphs its saving calls captured before."""
        variant = opobj.variants[decision.variant]
        ws = self._workspace(variant, key, decision)
        name = f"{key.text} {variant.name} (saving)"
        run = self._kept(self._saving_launchers, variant, key, decision, ws,
                         lambda: saving_launcher(opobj, variant, self.ctx.device, name=name))  # fmt: skip
        return variant, ws, run

    def _kept(self, launchers: dict[tuple, tuple[Any, Any]], variant: Any, key: ProblemKey,
              decision: Decision, ws: Any, make: Any) -> Any:  # fmt: skip
        """The launcher ``launchers`` holds for workspace ``ws``, made by ``make()`` on first use (or when
        the workspace it was made for is gone)."""
        self._prune_launchers()
        wkey = _wkey(variant, key, decision)
        held = launchers.get(wkey)
        if held is None or held[0] is not ws:
            held = launchers[wkey] = (ws, make())
        return held[1]

    def launch_stats(self) -> list[dict[str, Any]]:
        """Per kept workspace whose calls are CUDA-graph replays: its key and variant (``(saving)`` after
        it for the calls that keep what backward needs), and its launcher's captures, replays, evictions,
        graphs held and why it turned eager (None: it did not)."""
        from .replay import ReplayedRun

        self._prune_launchers()
        rows = []
        for launchers, suffix in ((self._launchers, ""), (self._saving_launchers, " (saving)")):
            for (key, variant, params), (_, run) in sorted(launchers.items(), key=lambda kv: kv[0][0].text):
                if isinstance(run, ReplayedRun):
                    row = {"key": key.text, "variant": variant + suffix, "params": params}
                    rows.append({**row, **run.stats()})
        return rows

    def _prune_launchers(self) -> None:
        """Drop the launchers of workspaces no longer kept (their graphs with them)."""
        for launchers in (self._launchers, self._saving_launchers):
            for wkey in [w for w, (ws, _) in launchers.items() if self._workspaces.get(w) is not ws]:
                del launchers[wkey]

    def _evict(self) -> None:
        """Drop the least recently used plans beyond ``workspace_cache``, and their workspaces where no
        plan left uses them."""
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
        self._prune_launchers()

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
        self._prune_launchers()


def _wkey(variant: Any, key: ProblemKey, decision: Decision) -> tuple:
    """A workspace's key: (key, variant, parameters as JSON)."""
    return (key, variant.name, json.dumps(dict(decision.params), sort_keys=True, default=str))
