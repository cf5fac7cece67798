"""Planted faulty variants, for the tuner's watchdog and validation tests only.

They are registered ONLY when the environment has ``AUTOTAXER_PLANTED_VARIANTS=1``; otherwise
``VARIANTS`` is empty and nothing here is ever tuned or served.

- ``planted_hang``: rank 1 sleeps forever inside ``run`` (the others then wait in a collective); valid at
  ``gather_dim=0`` only, so a run over both layouts hangs, and relaunches its group, once.
- ``planted_crash``: rank 1 kills itself with SIGSEGV inside ``run``.
- ``planted_wrong``: fast and wrong (writes zeros): it would win every race if validation let it.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from .._problem import ProblemKey, Target
from ..ops._base import Params, RunContext, Variant, Workspace

ENV_VAR = "AUTOTAXER_PLANTED_VARIANTS"


class _Planted(Variant):
    device_types = frozenset({"cpu", "cuda"})

    def prepare(self, key, params: Params, ctx: RunContext) -> Workspace:
        return Workspace(key, dict(params))

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a_shard, _ = inputs
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        if ctx.rank == 1 or ctx.world_size == 1:
            self._fault()
        return out.zero_()

    def _fault(self) -> None:
        """What goes wrong on rank 1."""


class PlantedHang(_Planted):
    name = "planted_hang"

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        # one hang per run of both layouts: each relaunches the group, seconds at 8 ranks
        return None if key.get("gather_dim", 0) == 0 else "gather_dim: planted_hang hangs at 0 only"

    def _fault(self) -> None:
        threading.Event().wait()  # forever; only the watchdog ends this


class PlantedCrash(_Planted):
    name = "planted_crash"

    def _fault(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


class PlantedWrong(_Planted):
    name = "planted_wrong"


VARIANTS = [PlantedHang(), PlantedCrash(), PlantedWrong()] if os.environ.get(ENV_VAR) == "1" else []
