"""``fused``: one Iris kernel computes the partials, pushes them into every rank's inbox and combines.

See ``kernels/flash_decode/fused.py`` for the protocol (device tickets and epochs, parity slots,
release/acquire flags). Saves BSP's all-gather and combine launches and the host-visible gap between
them; the decode itself is the same split-KV body as BSP's.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import local_length
from ._space import check_gpu_params, gpu_search_space, seed_params
from .bsp import decode_config, split_inputs


class FusedVariant(Variant):
    name = "fused"
    device_types = frozenset({"cuda"})

    def unavailable_reason(self, target: Target) -> str | None:
        reason = super().unavailable_reason(target)
        if reason is None and importlib.util.find_spec("iris") is None:
            reason = "fused needs Iris (tokenspeed-iris), which is not installed"
        return reason

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return gpu_search_space()

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        return check_gpu_params(key, params)

    def default_params(self, key: ProblemKey, target: Target) -> dict[str, Any]:
        """The best-guess seed (the same split heuristic as BSP), else the first valid point."""
        seeds = seed_params(key, target)
        return seeds[0] if seeds else super().default_params(key, target)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        return seed_params(key, target)

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        """Allocate the symmetric inbox and flags (collective, same order on every rank), zero the flags
        and the ticket once, and wait until every rank has done so before any rank can push."""
        import torch
        import torch.distributed as dist

        from autotaxer.kernels.flash_decode.fused import flag_shape, inbox_shapes

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"fused: {reason}")
        cfg = decode_config(params)
        heap = ctx.iris()
        if heap.get_num_ranks() != ctx.world_size:
            raise ValueError(
                f"fused: the Iris heap spans {heap.get_num_ranks()} ranks but the group has {ctx.world_size}"
            )
        o_shape, lse_shape = inbox_shapes(key["B"], key["H"], key["D"], ctx.world_size, cfg.splits)
        buffers = {
            "config": cfg,
            "rank": heap.get_rank(),
            "inbox_o": heap.zeros(*o_shape, dtype=torch.float32),
            "inbox_lse": heap.zeros(*lse_shape, dtype=torch.float32),
            "flags": heap.zeros(
                *flag_shape(key["B"], key["Hkv"], ctx.world_size, cfg.splits), dtype=torch.int64
            ),
            "ticket": torch.zeros((1,), dtype=torch.int64, device=ctx.device),
            "heap_bases": heap.get_heap_bases(),
            "full_lengths": torch.full((key["B"],), local_length(key), dtype=torch.int32, device=ctx.device),
            "watch": ctx.watch_slot(key, self.name),  # bounds the consumers' waits on peers, names this site
        }
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        if ctx.world_size > 1:
            dist.barrier(group=ctx.group)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        from autotaxer.kernels.flash_decode.fused import flash_decode_fused

        key, buf = ws.key, ws.buffers
        q, k, v, lengths = split_inputs(inputs, buf["full_lengths"])
        if out is None:
            out = torch.empty((key["B"], key["H"], key["D"]), dtype=torch_dtype(key.dtype), device=ctx.device)
        flash_decode_fused(
            q, k, v, lengths, out,
            inbox_o=buf["inbox_o"], inbox_lse=buf["inbox_lse"], flags=buf["flags"], ticket=buf["ticket"],
            heap_bases=buf["heap_bases"], rank=buf["rank"], world_size=ctx.world_size, config=buf["config"],
            watch=buf["watch"].tensor,
        )  # fmt: skip
        return out


VARIANTS = [FusedVariant()]
