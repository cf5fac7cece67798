"""Host side shared by the copy-engine variants of both ops (``ag_gemm``'s ``copy_engine``, ``ce_fanout``,
``ce_grouped``; ``gemm_rs``'s ``copy_engine``): whether the transport runs on a target, the check of the
signal back end and dtype, and a workspace's channel, lanes and watch slot. Light: no torch, Triton or Iris
imports at module level.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any, ClassVar

from .._problem import ProblemKey, Target, torch_dtype
from ._base import Params, RunContext, Variant


class CopyEngineBase(Variant):
    """Where every copy-engine variant runs: CUDA devices of NVIDIA (``cuMemcpyAsync``), with the
    ``cuda.bindings`` and ``iris`` packages; a variant declares its space and seeds as its op's
    ``_space`` functions (``space_of``, ``seeds_of``: ``key -> ...``)."""

    device_types = frozenset({"cuda"})
    space_of: ClassVar[Callable[[ProblemKey], dict[str, tuple[Any, ...]]]]
    seeds_of: ClassVar[Callable[[ProblemKey], list[dict[str, Any]]]]

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return type(self).space_of(key)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        return type(self).seeds_of(key)

    def unavailable_reason(self, target: Target) -> str | None:
        reason = super().unavailable_reason(target)
        if reason is None and not target.is_nvidia:
            reason = f"{self.name} issues peer copies with cuMemcpyAsync (NVIDIA only)"
        for module in ("cuda.bindings", "iris"):
            if reason is None and not _installed(module):
                reason = f"{self.name} needs the {module} package"
        return reason


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def transport_error(name: str, key: ProblemKey, signal: str) -> str | None:
    """Why ``signal`` (the flags' back end) or ``key``'s world size and dtype cannot run a copy-engine
    schedule, or None."""
    from autotaxer.kernels.common.channel import BACKENDS

    if key.world_size < 2:
        return f"{name} needs at least 2 ranks"
    if signal not in BACKENDS:
        return f"signal: unknown back end {signal!r}"
    if signal == "memop":
        from autotaxer.kernels.common.signal import memop_available

        reason = memop_available()
        if reason is not None:
            return f"signal=memop: {reason}"
    if key.dtype not in ("bf16", "fp16"):
        return f"dtype: {name} supports bf16 and fp16, not {key.dtype}"
    return None


def channel_buffers(
    name: str, key: ProblemKey, params: Params, ctx: RunContext, plan: Callable[[Any, int], Any]
) -> dict[str, Any]:
    """A workspace's buffers: the channel of ``params["signal"]`` (collective on first use), the call's
    ``plan(channel, element bytes)``, its lanes' streams (made now, never inside a CUDA-graph capture),
    the inbox arena in ``key``'s dtype and the watch slot bounding the flag waits."""
    import torch

    from autotaxer.kernels.common.channel import get_channel
    from autotaxer.kernels.common.lanes import lane_streams

    dtype = torch_dtype(key.dtype)
    channel = get_channel(ctx.iris(), params["signal"], ctx.rank, ctx.world_size, ctx.group)
    made = plan(channel, torch.empty((), dtype=dtype).element_size())
    lane_streams(channel, len(made.lanes))
    return {
        "channel": channel,
        "plan": made,
        "inbox": channel.arena(0).view(dtype),
        "watch": ctx.watch_slot(key, name),
    }
