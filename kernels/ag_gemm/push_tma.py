"""``ag_gemm`` push_tma: ``push`` with a TMA consumer (NVIDIA sm_90+): the fused kernel with ``TMA``
(:mod:`.consume_tma`).

Same buffers, grid and launch arguments as ``push`` (:func:`.fused._launch_args`), so the two consumers
keep one epoch, one tile queue and one inbox protocol. A call whose tensors TMA cannot address (a base
or a row stride off 16 bytes, B with neither stride 1, gather_dim=0 tiles straddling two ranks' rows)
runs ``push``'s kernel with the same config instead. The tile descriptors are made on the device, in
a global scratch Triton asks an allocator for at launch: the launcher supplies one (kept in the
workspace's launch cache, so repeated and graph-captured calls reuse it).
"""

from __future__ import annotations

from typing import Any

from .fused import FusedConfig, launch


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


def ag_gemm_push_tma(*, a_shard, b, inbox, gather_dim: int, config: FusedConfig, **kwargs: Any):
    """``out = all_gather(a_shard, gather_dim) @ b`` by push with TMA loads in the GEMM; arguments as
    ``ag_gemm_push`` (:func:`.fused.launch`)."""
    # push's kernel on the same grid and buffers where TMA cannot address the tensors: the epoch
    # (arrivals // grid) and the flags mean the same whichever consumer a call runs
    return launch(
        "push", a_shard=a_shard, b=b, inbox=inbox, gather_dim=gather_dim, config=config,
        tma=lambda: tma_ready(a_shard, b, inbox, gather_dim, config) is None, **kwargs,
    )  # fmt: skip
