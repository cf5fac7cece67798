"""``push_split`` (experimental): ``push``'s transport, the GEMM handed out in split-K pieces.

See ``autotaxer.kernels.ag_gemm_split``: at one wave of tiles the pieces that read only local data run while
the peer's shard lands. Opt-in (``--variants ...,push_split``) until measured on GPUs.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target
from .._base import Params, RunContext, Variant, Workspace
from .push import PushVariant

#: fp32 partials one workspace may hold (one ``block_m x block_n`` slot per piece).
_PARTIALS_BYTES = 256 << 20


class PushSplitVariant(Variant):
    name = "push_split"
    experimental = True
    _push = PushVariant()  # the transport, tiles, checks and buffers are push's

    def unavailable_reason(self, target: Target) -> str | None:
        reason = self._push.unavailable_reason(target)
        return None if reason is None else f"push_split: {reason}"

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        space = dict(self._push.search_space(key, target))
        space["comm_sms"] = tuple(c for c in space["comm_sms"] if c > 0)  # dedicated producers only
        space["prefetch_k"] = (0,)  # pieces wait per K chunk: no B prefetch
        return {**space, "split": (2, 4, 8)}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """128x128 tiles, 16 producers over 16 row chunks, K in 2 and 4 pieces (one wave of tiles at
        N=8192, M=256 on 132 SMs)."""
        base = dict(
            block_m=128, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4, comm_sms=16,
            row_chunks=16, k_chunks=4, prefetch_k=0,
        )  # fmt: skip
        return [{**base, "split": 2}, {**base, "split": 4}]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels._ag_fused import FusedConfig
        from autotaxer.kernels.ag_gemm_split import check_split, partials_count

        if "split" not in params:
            return "missing parameters: split"
        base = {k: v for k, v in params.items() if k != "split"}
        reason = self._push.check(key, target, base)
        if reason is not None:
            return reason
        if base["prefetch_k"]:
            return "prefetch_k: push_split runs without the B prefetch"
        reason = check_split(params["split"], base["comm_sms"], key["gather_dim"], key.world_size)
        if reason is not None:
            return reason
        need = 4 * partials_count(key["M"], key["N"], FusedConfig(**base), params["split"])
        if need > _PARTIALS_BYTES:
            return f"split: {need} B of fp32 partials exceed {_PARTIALS_BYTES} B"
        return None

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm_split import counters_count, partials_count

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"push_split params {dict(params)}: {reason}")
        base = {k: v for k, v in params.items() if k != "split"}
        buffers = dict(self._push.prepare(key, base, ctx).buffers)  # inbox, flags, sync, heap bases, config
        config = buffers["config"]
        m, n = key["M"], key["N"]
        buffers["split"] = params["split"]
        buffers["partials"] = torch.empty(
            partials_count(m, n, config, params["split"]), dtype=torch.float32, device=ctx.device
        )
        buffers["counters"] = torch.zeros(counters_count(m, n, config), dtype=torch.int32, device=ctx.device)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        from autotaxer.kernels.ag_gemm_split import ag_gemm_split

        a_shard, b = inputs
        buf = ws.buffers
        out = buf["out"] if out is None else out
        return ag_gemm_split(
            a_shard=a_shard, b=b, out=out, inbox=buf["data"], flags=buf["flags"], sync=buf["sync"],
            heap_bases=buf["heap_bases"], partials=buf["partials"], counters=buf["counters"], rank=ctx.rank,
            world_size=ctx.world_size, gather_dim=ws.key["gather_dim"], config=buf["config"],
            split=buf["split"], num_sms=ctx.target.num_sms,
        )  # fmt: skip


VARIANTS = [PushSplitVariant()]
