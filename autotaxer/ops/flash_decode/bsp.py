"""``bsp``: local split-KV decode, all-gather of the (O, LSE) partials, then a combine kernel.

Three launches per call (decode, NCCL all-gather, combine); the baseline of every flash_decode
speedup. On CPU (gloo) the local part and the combine are torch math, so the CPU tuner can tune it.
The search-space helpers here are shared with the fused variant.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from ._op import combine_torch, local_length, partials_torch

GPU_PARAMS = ("block_n", "splits", "num_warps", "num_stages")
#: Largest world_size * splits the combine accepts (kernels.flash_decode.MAX_PARTIALS).
MAX_PARTIALS = 1024
#: Shared memory per CTA on H100/H200 (227 KiB).
SMEM_BUDGET = 227 * 1024


def gpu_search_space() -> dict[str, tuple[Any, ...]]:
    """KV block size, splits per rank, warps and stages; the first values are the safe default."""
    return {
        "block_n": (64, 32, 128),
        "splits": (16, 8, 32, 64, 4, 2, 1),
        "num_warps": (4, 8),
        "num_stages": (2, 1, 3, 4),
    }


def check_gpu_params(key: ProblemKey, params: Params) -> str | None:
    """Why ``params`` cannot serve ``key`` (missing, out of range, more splits than KV blocks), or None."""
    missing = set(GPU_PARAMS) - set(params)
    if missing:
        return f"missing parameters: {', '.join(sorted(missing))}"
    bn, splits = params["block_n"], params["splits"]
    if bn not in (16, 32, 64, 128, 256):
        return f"block_n: must be a power of two in 16..256, got {bn}"
    if not isinstance(splits, int) or splits < 1:
        return f"splits: must be a positive integer, got {splits!r}"
    if params["num_warps"] not in (1, 2, 4, 8, 16):
        return f"num_warps: must be 1, 2, 4, 8 or 16, got {params['num_warps']}"
    if not 1 <= params["num_stages"] <= 8:
        return f"num_stages: must be in 1..8, got {params['num_stages']}"
    blocks = -(-local_length(key) // bn)
    if splits > blocks:
        return f"splits: {splits} splits of {bn}-position blocks exceed the {blocks} blocks of a shard"
    if key.world_size * splits > MAX_PARTIALS:
        return f"splits: world_size * splits = {key.world_size * splits} exceeds {MAX_PARTIALS}"
    esize = 4 if key.dtype == "fp32" else 2
    # K and V tiles of every stage but one, plus scratch (checked against sm_90 compiles of the kernel)
    smem = max(params["num_stages"] - 1, 1) * 2 * bn * key["D"] * esize + 16 * 1024
    if smem > SMEM_BUDGET:
        stages = params["num_stages"]
        return f"num_stages: {stages} stages of {bn}x{key['D']} K/V tiles need {smem} B of shared memory"
    return None


def decode_config(params: Params):
    """The kernel config of ``params`` (imports Triton)."""
    from ...kernels.flash_decode import DecodeConfig

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
        from ...kernels.flash_decode import combine_partials, decode_partials

        decode_partials(q, k, v, lengths, send[:n_o], send[n_o:], config=buf["config"])
        _gather(send, gathered, ctx)
        combine_partials(
            gathered, gathered.view(-1)[n_o:], out,
            world_size=ctx.world_size, splits=splits, stride_rank=send.numel(),
        )  # fmt: skip
        return out


VARIANTS = [BspVariant()]
