"""``ag_gemm`` push_tma: ``push`` with a TMA consumer (NVIDIA sm_90+); the kernel is
``_ag_fused_tma.fused_ag_gemm_tma_kernel``.

Same buffers, grid and launch arguments as ``push`` (``_ag_fused._launch_args``), so the two kernels
keep one epoch, one tile queue and one inbox protocol. A call whose tensors TMA cannot address (a base
or a row stride off 16 bytes, B with neither stride 1, gather_dim=0 tiles straddling two ranks' rows)
runs ``push``'s kernel with the same config instead. The tile descriptors are made on the device, in
a global scratch Triton asks an allocator for at launch: the launcher supplies one (kept in the
workspace's launch cache, so repeated and graph-captured calls reuse it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._ag_fused import KERNEL, FusedConfig, _launch_args, _specialization
from ._ag_fused_tma import fused_ag_gemm_tma_kernel

TMA_KERNEL = fused_ag_gemm_tma_kernel


def tma_ready(a_shard, b, inbox, gather_dim: int, config: FusedConfig) -> str | None:
    """Why TMA cannot address this call's tensors (``None`` when it can)."""
    elem = a_shard.element_size()
    ms, ks = a_shard.shape
    if gather_dim == 0 and ms % config.block_m:
        return f"gather_dim=0 tiles of {config.block_m} rows straddle {ms}-row shards"
    if b.stride(1) != 1 and b.stride(0) != 1:
        return "b: neither stride is 1"
    b_row = b.stride(0) if b.stride(1) == 1 else b.stride(1)
    for what, value in (
        ("a_shard's base", a_shard.data_ptr()),
        ("a_shard's row stride", a_shard.stride(0) * elem),
        ("b's base", b.data_ptr()),
        ("b's leading stride", b_row * elem),
        ("the inbox's base", inbox.data_ptr()),
        ("a shard row", ks * elem),
    ):
        if value % 16:
            return f"{what} is not a multiple of 16 bytes"
    return None  # (gather_dim=1's K-slices of B then start on 16 bytes too)


class _Scratch:
    """Triton's allocator for the device-made descriptors: one buffer, grown on demand, reused."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = None

    def __call__(self, size: int, alignment: int, stream: Any):
        import torch

        if self.buf is None or self.buf.numel() < size:
            self.buf = torch.empty(max(size, 4096), dtype=torch.int8, device="cuda")
        return self.buf


@contextmanager
def _allocator(scratch: _Scratch) -> Iterator[None]:
    """Triton's allocator set to ``scratch`` for the launches inside (a ContextVar, so graph capture and
    other threads' launches are unaffected)."""
    from triton.runtime import _allocation

    token = _allocation._allocator.set(scratch)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


class _CompiledTmaLaunch:
    """A compiled launch (as ``_ag_fused._CompiledLaunch``) run with the workspace's scratch allocator."""

    __slots__ = ("runner", "args", "scratch")

    def __init__(self, compiled: Any, grid: int, args: list[Any], scratch: _Scratch) -> None:
        self.runner = compiled[(grid, 1, 1)]
        self.args = args
        self.scratch = scratch

    def __call__(self, a_shard: Any, b: Any, out: Any) -> None:
        args = self.args
        args[0], args[1], args[2] = a_shard, b, out
        try:
            with _allocator(self.scratch):
                self.runner(*args)
        finally:
            args[0] = args[1] = args[2] = None


def ag_gemm_push_tma(
    *,
    a_shard,
    b,
    out,
    inbox,
    flags,
    sync,
    heap_bases,
    rank: int,
    world_size: int,
    gather_dim: int,
    config: FusedConfig,
    num_sms: int,
    phase: str = "all",
    cache: dict | None = None,
):
    """``out = all_gather(a_shard, gather_dim) @ b`` by push with TMA loads in the GEMM; arguments as
    ``ag_gemm_push`` (:func:`_ag_fused.fused_launcher`)."""
    fast = cache is not None and phase == "all"
    if fast:
        spec = _specialization(a_shard, b, out)
        compiled = cache.get(spec)
        if compiled is not None:
            compiled(a_shard, b, out)
            return out
    grid, args, options = _launch_args(
        "push", a_shard=a_shard, b=b, out=out, buf=inbox, flags=flags, sync=sync, heap_bases=heap_bases,
        rank=rank, world_size=world_size, gather_dim=gather_dim, config=config, num_sms=num_sms,
        phase=phase,
    )  # fmt: skip
    if TMA_KERNEL.arg_names != KERNEL.arg_names:
        raise TypeError("push_tma: its kernel's parameters must be push's, in push's order")
    # push's kernel on the same grid and buffers where TMA cannot address the tensors: the epoch
    # (arrivals // grid) and the flags mean the same whichever kernel a call runs
    kernel = TMA_KERNEL if tma_ready(a_shard, b, inbox, gather_dim, config) is None else KERNEL
    scratch = cache.setdefault("tma_scratch", _Scratch()) if cache is not None else _Scratch()
    with _allocator(scratch):
        handle = kernel[(grid,)](*args, **options)
    if fast and hasattr(handle, "run") and len(cache) < 64:
        cache[spec] = _CompiledTmaLaunch(handle, grid, [None, None, None, *args[3:]], scratch)
    return out
