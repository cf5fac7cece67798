"""``bsp``: local split-KV decode, all-gather of the (O, LSE) partials, then a combine kernel.

Three launches per call (decode, NCCL all-gather, combine); the baseline of every flash_decode
speedup. On CPU (gloo) the local part and the combine are torch math, so the CPU tuner can tune it.
The search space and seeds are shared with the fused variant (``_space.py``).
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import combine_torch, local_length, partials_torch
from ._space import check_gpu_params, gpu_search_space, seed_params


def decode_config(params: Params):
    """The kernel config of ``params`` (imports Triton)."""
    from autotaxer.kernels.flash_decode.partials import DecodeConfig

    cfg = DecodeConfig(
        block_n=int(params["block_n"]),
        splits=int(params["splits"]),
        num_warps=int(params["num_warps"]),
        num_stages=int(params["num_stages"]),
    )
    cfg.validate()
    return cfg


def split_inputs(inputs: tuple[Any, ...], full_lengths: Any) -> tuple[Any, Any, Any, Any]:
    """``(q, k, v, lengths)`` from 3 or 4 inputs; without lengths every position of the shard is valid."""
    if len(inputs) == 4:
        return inputs
    if len(inputs) != 3:
        raise ValueError(f"flash_decode: expected (q, k, v[, lengths]), got {len(inputs)} inputs")
    return (*inputs, full_lengths)


def _gather(send: Any, gathered: Any, ctx: RunContext) -> None:
    import torch.distributed as dist

    if ctx.world_size == 1:
        gathered[0].copy_(send)
    elif ctx.target.device_type == "cpu":
        dist.all_gather(list(gathered.unbind(0)), send, group=ctx.group)
    else:
        dist.all_gather_into_tensor(gathered, send, group=ctx.group)


class BspVariant(Variant):
    name = "bsp"
    device_types = frozenset({"cuda", "cpu"})
    is_baseline = True

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        if target.device_type == "cpu":
            return {"splits": (1, 2, 4)}
        return gpu_search_space()

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        if target.device_type == "cpu":
            splits = params.get("splits")
            if not isinstance(splits, int) or splits < 1:
                return f"splits: must be a positive integer, got {splits!r}"
            return None
        return check_gpu_params(key, params)

    def default_params(self, key: ProblemKey, target: Target) -> dict[str, Any]:
        """On GPUs the best-guess seed (what dispatch runs for an untuned shape); on CPU the first point."""
        if target.device_type == "cpu":
            return super().default_params(key, target)
        seeds = seed_params(key, target)
        return seeds[0] if seeds else super().default_params(key, target)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        return [] if target.device_type == "cpu" else seed_params(key, target)

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"bsp: {reason}")
        bsz, h, d, splits = key["B"], key["H"], key["D"], int(params["splits"])
        n = bsz * h * splits * (d + 1)  # O (B, H, splits, D) then LSE (B, H, splits), one all-gather
        buffers = {
            "send": torch.empty((n,), dtype=torch.float32, device=ctx.device),
            "gathered": torch.empty((ctx.world_size, n), dtype=torch.float32, device=ctx.device),
            "full_lengths": torch.full((bsz,), local_length(key), dtype=torch.int32, device=ctx.device),
        }
        if ctx.target.device_type == "cuda":
            buffers["config"] = decode_config(params)
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        key, buf = ws.key, ws.buffers
        q, k, v, lengths = split_inputs(inputs, buf["full_lengths"])
        bsz, h, d, splits = key["B"], key["H"], key["D"], int(ws.params["splits"])
        n_o = bsz * h * splits * d
        send, gathered = buf["send"], buf["gathered"]
        if out is None:
            out = torch.empty((bsz, h, d), dtype=torch_dtype(key.dtype), device=ctx.device)
        if ctx.target.device_type == "cpu":
            o, lse = partials_torch(q, k, v, lengths, splits)
            send[:n_o].copy_(o.reshape(-1))
            send[n_o:].copy_(lse.reshape(-1))
            _gather(send, gathered, ctx)
            o_all = gathered[:, :n_o].view(ctx.world_size, bsz, h, splits, d).permute(1, 2, 0, 3, 4)
            lse_all = gathered[:, n_o:].view(ctx.world_size, bsz, h, splits).permute(1, 2, 0, 3)
            merged = combine_torch(o_all.reshape(bsz, h, -1, d), lse_all.reshape(bsz, h, -1))
            out.copy_(merged)
            return out
        from autotaxer.kernels.flash_decode.partials import combine_partials, decode_partials

        decode_partials(q, k, v, lengths, send[:n_o], send[n_o:], config=buf["config"])
        _gather(send, gathered, ctx)
        combine_partials(
            gathered, gathered.view(-1)[n_o:], out,
            world_size=ctx.world_size, splits=splits, stride_rank=send.numel(),
        )  # fmt: skip
        return out


VARIANTS = [BspVariant()]
