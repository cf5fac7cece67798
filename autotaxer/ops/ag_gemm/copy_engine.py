"""``copy_engine``: peer copies by the copy engine on a side stream, vendor GEMMs as chunks land.

No SM does communication: each rank pushes its shard into every peer's Iris inbox with
``cuMemcpyAsync`` over NVLink and raises a flag per chunk (Triton release kernels with a
device-resident epoch, or CUDA stream memops); the caller's stream runs the local shard's GEMM first,
then each peer chunk's GEMM once its flag is up. See ``autotaxer.kernels.ag_gemm.copy_engine`` for the
schedule.

Parameters: ``signal`` (``triton`` | ``memop``), ``chunks`` per peer shard, ``gather_first`` (wait for
all, then one GEMM: small M, ``gather_dim=0`` only), ``accumulate`` (``gather_dim=1``: ``out`` adds
into the output, ``fp32`` into an fp32 workspace converted at the end) and ``order`` of the peers.

Calls that keep the gathered A (training: saved for the weight's gradient; ``return_A``) get it from
:meth:`CopyEngineVariant.run_for_backward`: the inbox's peer shards copied out at the end of the call
(2026-11-27; before, such calls were served the fastest form that could hand A out).

Measured: 2×H200, the shipped ws2 tables' most frequent ``ag_gemm`` winner (23 of 89 eager records, 30
of 89 graph-timed; ``bench/results/2026-11-28_ws2_finish_h200x2/``); 4×H200 (2026-11-28, dependent
graph timing, tuned): 0.71-1.21× BSP over the TP4 layer's 8 ``ag_gemm`` keys, below BSP at M=1024, served
at M=8192 N=14336 (1.12×; ``bench/results/2026-11-28_tp4_tuned_layer_h200x4/``); 8×H200 (2026-11-22,
seeds, N=K=8192): 1.1-1.8× slower than BSP at M=1024 and 4096, seven copies on one stream and seven
GEMMs of M/8 rows (``bench/results/2026-11-22_ws8_h200x8/``).
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params, RunContext, Workspace
from .._copy_engine import CopyEngineBase, channel_buffers, transport_error
from ._space import copy_engine_seeds, copy_engine_space


class CopyEngineVariant(CopyEngineBase):
    """``copy_engine``, and the base of ``ag_gemm``'s other copy-engine schedules (``ce_fanout``,
    ``ce_grouped``), which name their kernel (:meth:`launcher`), resolve their plan (:meth:`plan`) and
    declare their space; availability, the workspace and the call are shared."""

    name = "copy_engine"
    space_of = staticmethod(copy_engine_space)
    seeds_of = staticmethod(copy_engine_seeds)  # the 2xH200 tuning run's usual winners

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.ag_gemm.copy_engine import MAX_CHUNKS

        gd, ws = key["gather_dim"], key.world_size
        missing = {"signal", "chunks", "gather_first", "accumulate", "order"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        reason = transport_error(self.name, key, params["signal"])
        if reason is not None:
            return reason
        rows = key["M"] // ws if gd == 0 else key["M"]
        chunks = params["chunks"]
        if not 1 <= chunks <= min(rows, MAX_CHUNKS):
            return f"chunks: {chunks} outside 1..{min(rows, MAX_CHUNKS)} for {rows} shard rows"
        if params["gather_first"] and (gd != 0 or chunks != 1):
            return "gather_first: only with gather_dim=0 and chunks=1"
        if params["accumulate"] not in ("out", "fp32") or (gd == 0 and params["accumulate"] != "out"):
            return f"accumulate: {params['accumulate']!r} is not valid for gather_dim={gd}"
        if params["order"] not in ("rotated", "reverse"):
            return f"order: unknown order {params['order']!r}"
        return None

    def plan(self, channel: Any, elem: int, key: ProblemKey, params: Params) -> Any:
        """The schedule's plan of a call (collective: may grow the channel's arena)."""
        from autotaxer.kernels.ag_gemm.copy_engine import make_plan

        return make_plan(
            channel, m=key["M"], k=key["K"], gather_dim=key["gather_dim"], elem=elem, chunks=params["chunks"],
            order=params["order"], gather_first=params["gather_first"],
            fp32_accumulate=params["accumulate"] == "fp32",
        )  # fmt: skip

    def launcher(self) -> Any:
        """The schedule's launcher: ``(channel, plan, inbox, a_shard, b, out, acc, watch=) -> out``."""
        from autotaxer.kernels.ag_gemm.copy_engine import ag_gemm_ce

        return ag_gemm_ce

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"{self.name}: {reason}")
        buffers = channel_buffers(
            self.name, key, params, ctx, lambda channel, elem: self.plan(channel, elem, key, params)
        )
        if params["accumulate"] == "fp32":
            buffers["acc"] = torch.empty((key["M"], key["N"]), dtype=torch.float32, device=ctx.device)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        return self._launch(ws, inputs, out)

    def saves_for_backward(self) -> bool:
        """True for this schedule (its inbox holds every peer's shard); the schedules built on it that
        name another launcher (``ce_fanout``, ``ce_grouped``) do not hand the gathered A out."""
        return type(self).launcher is CopyEngineVariant.launcher

    def run_for_backward(
        self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None
    ) -> Any:
        """``(C, gathered A)`` as fresh tensors (``out``: a ``(C, A)`` pair written in place, the form a
        replayed call takes): the call copies the peers' shards out of its inbox before it tells them the
        inbox is free (:func:`autotaxer.kernels.ag_gemm.copy_engine.hand_out`). None where
        :meth:`saves_for_backward` is False."""
        import torch

        if not self.saves_for_backward():
            return None
        if out is None:
            a_shard = inputs[0]
            m, k = ws.key["M"], ws.key["K"]
            out = (None, torch.empty((m, k), dtype=a_shard.dtype, device=a_shard.device))
        c, gathered = out
        return self._launch(ws, inputs, c, gathered), gathered

    def _launch(self, ws: Workspace, inputs: tuple[Any, ...], out: Any, gathered: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        a_shard = a_shard.contiguous()  # the peer copies move whole rows; B may be kn or nk (vendor GEMMs)
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        elif not out.is_contiguous():
            raise ValueError(f"{self.name}: out must be contiguous")
        buf = ws.buffers
        args = (buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf.get("acc"))
        if gathered is None:  # the call as it always was (its records' launches)
            return self.launcher()(*args, watch=buf["watch"].tensor)
        return self.launcher()(*args, watch=buf["watch"].tensor, gathered=gathered)


VARIANTS = [CopyEngineVariant()]
