"""Host side of the warp-specialised consumer (:mod:`._ag_ws_kernel`): checks, descriptors, launch.

:func:`ag_gemm_ws` runs rank ``rank``'s GEMM of ``out = cat_r(A_r, gather_dim) @ b`` over ``push``'s
buffers: its own shard in place, peer ``p``'s from ``inbox[parity, p]`` once the chunk flags say it has
landed (``push``'s producers fill them; :mod:`.ag_gemm_push_ws` runs both). With ``wait=False`` it is a
plain GEMM over the same schedule (the inbox must then hold the data already), which is how the GEMM
alone is compared with cuBLAS. With ``forward=True`` (two ranks) no producer runs: the kernel's forward
warp sends the boxes of the local shard that its local tiles load (:func:`forward_error` says where).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton

from ...common.watch import unnamed_slot
from ..fused import inbox_shape
from .ws_kernel import ag_gemm_ws_kernel

KERNEL = ag_gemm_ws_kernel


@dataclass(frozen=True)
class WsConfig:
    """Tile and pipeline of the warp-specialised GEMM."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 4
    group_m: int = 8
    mma_wgs: int = 2  # MMA warpgroups (each takes block_m / mma_wgs rows of a tile)
    load_regs: int = 40  # registers a thread of the load warp keeps (the MMA warps get the rest)

    def smem_bytes(self, elem: int = 2) -> int:
        """Shared memory of the operand ring (plus barriers)."""
        return self.stages * (self.block_m + self.block_n) * self.block_k * elem + 16 * self.stages


#: Shared memory one Hopper CTA may use (sm_90: 227 KiB).
SMEM_LIMIT = 232448


def ws_config_error(config: WsConfig, elem: int = 2) -> str | None:
    """Why ``config`` cannot run (``None`` when it can)."""
    if config.mma_wgs not in (1, 2):
        return f"mma_wgs: {config.mma_wgs} (expected 1 or 2)"
    rows = config.block_m // config.mma_wgs
    if rows % 64 or rows * config.mma_wgs != config.block_m:
        return f"block_m: {config.block_m} gives {rows} rows per warpgroup (a multiple of 64 needed)"
    if config.block_n not in (64, 128, 256):
        return f"block_n: {config.block_n} (expected 64, 128 or 256)"
    if rows * config.block_n > 128 * 128:
        return f"accumulator {rows}x{config.block_n} per warpgroup needs over 128 registers a thread"
    if config.block_k not in (32, 64, 128):
        return f"block_k: {config.block_k} (expected 32, 64 or 128)"
    if config.stages < 2:
        return f"stages: {config.stages} (at least 2)"
    if config.smem_bytes(elem) > SMEM_LIMIT:
        return f"shared memory {config.smem_bytes(elem)} B over {SMEM_LIMIT}"
    return None


def tensors_error(a_shard: Any, b: Any, inbox: Any, gather_dim: int, config: WsConfig) -> str | None:
    """Why TMA cannot address these tensors with ``config`` (``None`` when it can): ``push_tma``'s rules
    (16-byte bases and strides, no gather_dim=0 tile straddling two ranks' rows), plus a contiguous shard
    row (this consumer's own share of the transfer reads it with vector loads)."""
    from ..push_tma import tma_ready

    if a_shard.stride(1) != 1:
        return "a_shard: its last dimension is not contiguous"
    return tma_ready(a_shard, b, inbox, gather_dim, config)


def _gl_dtype(dtype: Any) -> Any:
    import torch
    from triton.experimental.gluon import language as gl

    table = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
    if dtype not in table:
        raise TypeError(f"dtype: {dtype} (expected bfloat16 or float16)")
    return table[dtype]


def descriptors(a_shard: Any, b: Any, inbox: Any, config: WsConfig):
    """``(a_desc, inbox_desc, b_desc, b_row_major)`` for one call (host-built TMA descriptors); the inbox's
    ``(2, W, rows, Ks)`` slots are one ``(2 W rows, Ks)`` matrix."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dt = _gl_dtype(a_shard.dtype)
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    a_layout = gl.NVMMASharedLayout.get_default_for([bm, bk], dt)
    ms, ks = a_shard.shape
    a_desc = TensorDescriptor(a_shard, [ms, ks], [a_shard.stride(0), 1], [bm, bk], a_layout)
    slots = inbox.reshape(-1, ks)
    inbox_desc = TensorDescriptor(slots, list(slots.shape), [ks, 1], [bm, bk], a_layout)
    row_major = b.stride(1) == 1
    if row_major:
        layout = gl.NVMMASharedLayout.get_default_for([bk, bn], dt)
        b_desc = TensorDescriptor(b, list(b.shape), [b.stride(0), 1], [bk, bn], layout)
    else:
        bt = b.t()  # (N, K), K contiguous
        layout = gl.NVMMASharedLayout.get_default_for([bn, bk], dt)
        b_desc = TensorDescriptor(bt, list(bt.shape), [bt.stride(0), 1], [bn, bk], layout)
    return a_desc, inbox_desc, b_desc, row_major


class _Mapped:
    """A peer's memory as this process maps it (Iris' heap translation): what a descriptor needs."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: Any) -> None:
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def peer_slot_descriptors(a_shard: Any, inbox: Any, heap_bases: Any, rank: int, world_size: int,
                          config: WsConfig) -> tuple[Any, Any]:  # fmt: skip
    """The forward warp's store targets: this rank's slot of the peer's inbox at parity 0 and 1, each a
    ``(Ms, Ks)`` matrix at the peer's heap address as this process maps it (``heap_bases``: every rank's
    heap address, read once here), so a box's rows past the shard are clipped instead of landing in the
    next slot. Two ranks only."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if world_size != 2:
        raise ValueError(f"ag_gemm_ws: forwarding serves one peer (world_size 2), got {world_size}")
    bases = [int(x) for x in heap_bases.tolist()]
    delta = bases[(rank + 1) % 2] - bases[rank]
    ms, ks = a_shard.shape
    box = [config.block_m, config.block_k]
    layout = gl.NVMMASharedLayout.get_default_for(box, _gl_dtype(a_shard.dtype))
    descs = []
    for parity in (0, 1):
        base = _Mapped(inbox[parity, rank].data_ptr() + delta, a_shard.dtype)
        descs.append(TensorDescriptor(base, [ms, ks], [ks, 1], box, layout))
    return descs[0], descs[1]


def forward_error(geometry: tuple[int, int, int, int], config: WsConfig, gather_dim: int, tiles: int,
                  grid: int) -> str | None:  # fmt: skip
    """Why the forward warp cannot serve this call (``None`` when it can): one flag per box (row chunks of
    ``block_m`` rows, K chunks of ``block_k`` columns), and at gather_dim=1, where every tile both forwards
    and waits, one wave of tiles."""
    rcw, n_rc, kcw, _ = geometry
    if not (rcw == config.block_m or (n_rc == 1 and rcw <= config.block_m)) or kcw != config.block_k:
        return (
            f"chunks of {rcw} rows x {kcw} columns: forwarding raises one flag per {config.block_m}x"
            f"{config.block_k} box (row_chunks = the shard's row blocks, k_chunks = its K steps)"
        )
    if gather_dim == 1 and tiles > grid:
        return f"gather_dim=1: {tiles} tiles over {grid} CTAs; forwarding tiles wait too, so one wave only"
    return None


def consumer_group_m(config: WsConfig, gather_dim: int, ms: int, tiles: int, grid: int, forward: bool) -> int:
    """The kernel's ``group_m``: at gather_dim=0 tile groups never straddle two ranks' rows, so local tiles
    come first. Forwarding in one wave keeps ``config.group_m``'s order (every tile is resident, so no
    order can hold up a forwarding tile; groups pair the local and the peer's tiles that read the same
    columns of B)."""
    if gather_dim == 0 and not (forward and tiles <= grid):
        return max(1, min(config.group_m, ms // config.block_m))
    return config.group_m


def launch_args(
    *,
    a_shard: Any,
    b: Any,
    out: Any,
    inbox: Any,
    flags: Any,
    sync: Any,
    arrivals: int,
    rank: int,
    world_size: int,
    gather_dim: int,
    geometry: tuple[int, int, int, int],
    config: WsConfig,
    grid: int,
    wait: bool = True,
    heap_bases: Any = None,
    forward: bool = False,
    watch: Any = None,
) -> tuple[int, list[Any], dict[str, int]]:
    """Check one call; ``(grid, every kernel argument in signature order, launch options)``.

    ``inbox`` (``(2, world_size, rows, Ks)``), ``flags`` and ``sync`` are ``push``'s; ``geometry`` is
    ``(rcw, n_rc, kcw, n_kc)`` of its chunks; the call's epoch is ``sync[0] // arrivals + 1``, counted by
    the caller before the launch. The grid is at most ``grid`` CTAs (each fills an SM). With
    ``heap_bases`` (Iris' per-rank heap addresses) the kernel also moves the local shard into the peers'
    inboxes first, each CTA its share (``push``'s ``comm_sms=0``): then every CTA of the grid must be
    resident at once, which one CTA per SM and ``grid`` <= the SM count guarantee. With ``forward`` as well
    (two ranks) nothing moves the shard up front: the forward warp sends each box a local tile loads
    (:func:`forward_error` says which calls it can serve). ``watch``: the watch slot bounding the load
    warp's waits on peers (``kernels/common/watch.py``; None: the process's slot for unnamed launches).
    """
    elem = a_shard.element_size()
    why = ws_config_error(config, elem) or tensors_error(a_shard, b, inbox, gather_dim, config)
    if why is not None:
        raise ValueError(f"ag_gemm_ws: {why}")
    ms, ks = a_shard.shape
    m, n = out.shape
    k = b.shape[0]
    full = (ms * world_size, ks) if gather_dim == 0 else (ms, ks * world_size)
    if (m, k) != full or b.shape[1] != n or out.stride(1) != 1:
        raise ValueError(
            f"ag_gemm_ws: shard {tuple(a_shard.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} do not "
            f"make gather_dim={gather_dim} over {world_size} ranks (out must be row-major)"
        )
    box = inbox_shape(ms, ks, world_size)
    if tuple(inbox.shape) != box or inbox.dtype != a_shard.dtype:
        raise ValueError(
            f"ag_gemm_ws: inbox {tuple(inbox.shape)} {inbox.dtype}, expected {box} {a_shard.dtype}"
        )
    a_desc, inbox_desc, b_desc, row_major = descriptors(a_shard, b, inbox, config)
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    grid = min(grid, tiles)
    group_m = consumer_group_m(config, gather_dim, ms, tiles, grid, forward)
    rcw, n_rc, kcw, n_kc = geometry
    produce = heap_bases is not None
    bases = heap_bases if produce else sync  # unread without producing
    peer0 = peer1 = a_desc  # unread without forwarding
    if forward:
        why = forward_error(geometry, config, gather_dim, tiles, grid) if produce else "heap_bases missing"
        if why is not None:
            raise ValueError(f"ag_gemm_ws: forward: {why}")
        peer0, peer1 = peer_slot_descriptors(a_shard, inbox, heap_bases, rank, world_size, config)
        produce = False
    if watch is None:
        watch = unnamed_slot(sync.device)
    args = [
        a_desc, inbox_desc, b_desc, peer0, peer1, out, a_shard, inbox, bases, flags, sync, watch, arrivals,
        rank, m, n, k, ms, ks, rcw, n_rc, kcw, n_kc, group_m, a_shard.stride(0), out.stride(0), out.stride(1),
        gather_dim, world_size, wait, row_major, config.stages, config.mma_wgs, config.load_regs, produce,
        forward,
    ]  # fmt: skip
    if len(args) != len(KERNEL.arg_names):
        raise TypeError(f"{KERNEL.__name__}: parameters {KERNEL.arg_names} do not match the launcher's")
    return grid, args, {"num_warps": 4 * config.mma_wgs}


def ag_gemm_ws(**kwargs: Any) -> Any:
    """Launch the consumer for one call (arguments of :func:`launch_args`); returns the compiled kernel."""
    grid, args, options = launch_args(**kwargs)
    return KERNEL[(grid,)](*args, **options)
