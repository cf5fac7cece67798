"""Planted faulty variants, for the tuner's watchdog and validation tests only.

They are registered ONLY where the environment names this module (:data:`ENV`: ``$AUTOTAXER_VARIANTS``,
which every spawned rank and worker inherits); otherwise nothing here is ever tuned or served.

- ``planted_hang``: rank 1 sleeps forever inside ``run`` (the others then wait in a collective); valid at
  ``gather_dim=0`` only, so a run over both layouts hangs, and relaunches its group, once.
- ``planted_crash``: rank 1 kills itself with SIGSEGV inside ``run``.
- ``planted_wrong``: fast and wrong (writes zeros): it would win every race if validation let it.
- ``planted_raise``: rank 1 raises ``RuntimeError`` inside ``run`` (a candidate failing on one rank).
- ``planted_never_signal``: rank 0 (the only rank at world size 1) records in its watch slot what a kernel
  whose wait on rank 1's flag gave up records (``kernels/common/watch.py``), as if rank 1 never signalled.
- ``planted_slow``: right, and 20-25 ms slower a call than BSP at every point of its six-point space (two
  seeds): a variant no draw can bring back (the tuner's ``--reach``).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from .._problem import ProblemKey, Target
from ..ops._base import Params, RunContext, Variant, Workspace

#: The environment that registers these variants on ``ag_gemm`` (:data:`autotaxer.ops.VARIANTS_ENV_VAR`).
ENV = {"AUTOTAXER_VARIANTS": f"ag_gemm={__name__}"}


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


class PlantedRaise(_Planted):
    name = "planted_raise"

    def _fault(self) -> None:
        raise RuntimeError("planted_raise: this candidate fails on rank 1")


class PlantedNeverSignal(_Planted):
    name = "planted_never_signal"

    def prepare(self, key, params: Params, ctx: RunContext) -> Workspace:
        return Workspace(key, dict(params), {"watch": ctx.watch_slot(key, self.name)})

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        from autotaxer.kernels.common import watch as w

        if ctx.rank == 0:  # what give_up() writes when the wait on rank 1's flag 0 (epoch 1) gives up
            slot, alarm = ws.buffers["watch"].tensor, w.board(ctx.device).words
            for word, value in ((w.PEER, 1), (w.INDEX, 0), (w.EXPECTED, 1), (w.SEEN, 0), (w.WRITTEN, 1)):
                slot[word] = value
            slot[w.GAVE_UP] += 1
            alarm[0] += 1
        return super().run(ws, inputs, ctx, out)

    def _fault(self) -> None:
        return None


class PlantedSlow(_Planted):
    name = "planted_slow"

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"delay_ms": (20, 21, 22, 23, 24, 25)}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        return [{"delay_ms": 20}, {"delay_ms": 21}]

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        from ..ops.ag_gemm.bsp import BspVariant

        bsp = BspVariant()
        return Workspace(key, dict(params), {"bsp": (bsp, bsp.prepare(key, {}, ctx))})

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import time

        time.sleep(ws.params["delay_ms"] / 1000)
        bsp, bsp_ws = ws.buffers["bsp"]
        return bsp.run(bsp_ws, inputs, ctx, out)


VARIANTS = [
    PlantedHang(), PlantedCrash(), PlantedWrong(), PlantedRaise(), PlantedNeverSignal(), PlantedSlow()
]  # fmt: skip
