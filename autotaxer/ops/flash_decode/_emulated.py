"""``flash_decode``'s fused kernel on ranks emulated in one process (their heap: :mod:`.._emulated_heap`;
run by :mod:`autotaxer.tools.emulated_ranks`): rank 0's waits on peers that never signal."""

from __future__ import annotations

from typing import Any

from .._emulated_heap import EmulatedHeap, aligned_bytes
from .._forms import EmulatedForm


def _never_signal_fused(kind: str, ctx: Any, randn: Any, dtype: Any) -> Any:
    """Rank 0's call of the fused decode kernel; returns its watch slot."""
    import torch

    from autotaxer import ProblemKey

    dev, ws, target = ctx.device, ctx.world_size, ctx.target
    from autotaxer.kernels.flash_decode.fused import flag_shape, flash_decode_fused, inbox_shapes
    from autotaxer.kernels.flash_decode.partials import DecodeConfig

    b, h, hkv, d, s = 1, 2, 1, 64, 32
    config = DecodeConfig(block_n=16, splits=2, num_warps=4, num_stages=1)
    key = ProblemKey.make("flash_decode", target.gpu_model, ws, "fp32",
                          {"B": b, "H": h, "Hkv": hkv, "D": d, "S": s * ws}, {})  # fmt: skip
    o_shape, lse_shape = inbox_shapes(b, h, d, ws, config.splits)
    f_shape = flag_shape(b, hkv, ws, config.splits)
    sizes = (
        aligned_bytes(o_shape, torch.float32),
        aligned_bytes(lse_shape, torch.float32),
        aligned_bytes(f_shape, torch.int64),
    )
    heap = EmulatedHeap(ws, sum(sizes), dev)
    inbox_o, inbox_lse = heap.alloc(o_shape, torch.float32), heap.alloc(lse_shape, torch.float32)
    flags = heap.alloc(f_shape, torch.int64)
    slot = ctx.watch_slot(key, "fused")
    q, kv = randn(b, h, d), [randn(b, s, hkv, d) for _ in range(2)]
    lengths, ticket = torch.full((b,), s, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    flash_decode_fused(q, kv[0], kv[1], lengths.to(dev), torch.empty(b, h, d, dtype=dtype, device=dev),
                       inbox_o=inbox_o[0], inbox_lse=inbox_lse[0], flags=flags[0], ticket=ticket.to(dev),
                       heap_bases=heap.bases, rank=0, world_size=ws, config=config,
                       watch=slot.tensor)  # fmt: skip
    return slot


FORM = EmulatedForm(never_signal={"flash_decode": _never_signal_fused})
