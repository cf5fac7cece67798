"""``copy_engine_split``: ``copy_engine``'s transport with the GEMM split along N (``gather_dim=0``).

For mid M, where every GEMM reads all of ``B`` whatever its row count: the local rows' first
``first_cols`` fraction of the columns runs while the copy engine gathers, then the remaining columns
over every row, then the peers' rows of the first columns; only that first column block of ``B`` is
read twice (``copy_engine`` reads all of ``B`` once per row block). See
``autotaxer.kernels.ag_gemm_ce_split``. ``gather_dim=1`` already reads ``B`` once under
``copy_engine`` (each rank's K rows of ``B`` once), so it is refused there.

Parameters: ``first_cols`` (fraction of N in the first GEMM), ``signal`` (``memop`` | ``triton``)
and the peers' ``order``.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from .copy_engine import CopyEngineVariant

_FRACTIONS = (0.375, 0.25, 0.5, 0.625, 0.125, 0.75)


class CopyEngineSplitVariant(Variant):
    name = "copy_engine_split"
    device_types = frozenset({"cuda"})
    _transport = CopyEngineVariant()

    def unavailable_reason(self, target: Target) -> str | None:
        reason = self._transport.unavailable_reason(target)
        return None if reason is None else f"copy_engine_split: {reason}"

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "first_cols": _FRACTIONS,
            "signal": ("memop", "triton"),
            "order": ("rotated",) if key.world_size <= 2 else ("rotated", "reverse"),
        }

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """A first GEMM of 3/8 and 1/4 of the columns (about the gather's time at mid M on 2xH200)."""
        return [{"first_cols": f, "signal": "memop", "order": "rotated"} for f in (0.375, 0.25)]

    def _transport_params(self, params: Params) -> dict[str, Any]:
        return {
            "gather_first": True,
            "signal": params["signal"],
            "chunks": 1,
            "accumulate": "out",
            "order": params["order"],
        }

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from ...kernels.ag_gemm_ce_split import first_columns

        missing = {"first_cols", "signal", "order"} - set(params)
        if missing:
            return f"missing parameters: {', '.join(sorted(missing))}"
        if key["gather_dim"] != 0:
            return "gather_dim=1: copy_engine already reads B once there; the N split is for gather_dim=0"
        try:
            first_columns(key["N"], params["first_cols"])
        except ValueError as exc:
            return str(exc)
        return self._transport.check(key, target, self._transport_params(params))

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        from ...kernels.ag_gemm_ce_split import first_columns, schedule

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"copy_engine_split: {reason}")
        transport = self._transport.prepare(key, self._transport_params(params), ctx)
        n_first = first_columns(key["N"], params["first_cols"])
        steps = schedule(ctx.rank, ctx.world_size, key["M"] // ctx.world_size, key["N"], n_first)
        buffers = dict(transport.buffers, steps=steps)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from ...kernels.ag_gemm_ce_split import ag_gemm_ce_split

        a_shard, b = inputs
        if not (a_shard.is_contiguous() and b.is_contiguous()):
            raise ValueError("copy_engine_split: a_shard and b must be contiguous")
        if out is None:
            shape, dtype = (ws.key["M"], ws.key["N"]), torch_dtype(ws.key.dtype)
            out = torch.empty(shape, dtype=dtype, device=a_shard.device)
        elif not out.is_contiguous():
            raise ValueError("copy_engine_split: out must be contiguous")
        buf = ws.buffers
        return ag_gemm_ce_split(buf["channel"], buf["plan"], buf["inbox"], a_shard, b, out, buf["steps"])


VARIANTS = [CopyEngineSplitVariant()]
