"""Persistent Triton GEMM ``C = A @ B``: the compute core of the fused ag_gemm kernels.

A persistent grid of ``min(num_programs, tiles)`` CTAs walks the output tiles in grouped order; the
K loop (:func:`mma_k_range`) is the same one the fused kernels run per K segment, so benchmarking this
kernel alone against cuBLAS (``bench/gemm_vs_cublas.py``) measures the fused kernels' GEMM with the
communication taken away. Portable Triton only (pointer loads, no TMA), so it also builds for AMD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from .tiles import grouped_tile


@triton.jit
def mma_k_range(
    acc,
    a_ptrs,
    b_ptrs,
    k_lo,
    k_hi,
    stride_ak,
    stride_bk,
    mask_n,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    """Accumulate ``A[:, k_lo:k_hi] @ B[k_lo:k_hi, :]`` into ``acc``.

    ``a_ptrs`` / ``b_ptrs`` point at column / row ``k_lo``. Rows of A are never masked (callers clamp
    them); columns of B are masked by ``mask_n`` unless ``EVEN_N``; K only when ``EVEN_K`` is false.
    """
    offs_k = tl.arange(0, BLOCK_K)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            if EVEN_N:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = (k + offs_k) < k_hi
            a = tl.load(a_ptrs, mask=mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn):
    """Store one fp32 accumulator tile into ``C`` (its dtype), masked to ``M x N``."""
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.where(offs_m < M, offs_m, M - 1)  # clamp instead of masking A's rows
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = mma_k_range(
            acc, a_ptrs, b_ptrs, 0, K, stride_ak, stride_bk, offs_n < N, BLOCK_K, EVEN_K, EVEN_N
        )
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)


def validate_tiles(config: Any) -> None:
    """Raise ``ValueError`` naming the first bad tile field of ``config`` (``block_m``, ``block_n``,
    ``block_k``: powers of two >= 16; ``group_m``, ``num_stages`` >= 1; ``num_warps``: a power of two
    <= 16)."""
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(config, name)
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name}: must be a power of two >= 16, got {v}")
    if config.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps: must be a power of two <= 16, got {config.num_warps}")
    for name in ("group_m", "num_stages"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(config, name)}")


def smem_bytes(config: Any, elem_bytes: int) -> int:
    """Shared memory a pipelined K loop of ``config``'s tiles allocates: ``num_stages`` A and B tiles.

    Matches Triton's ``metadata.shared`` on sm_90 (checked by ``autotaxer/tools/sm90.py``), where the
    epilogue reuses the pipeline's buffers.
    """
    return config.num_stages * (config.block_m + config.block_n) * config.block_k * elem_bytes


def register_error(config: Any) -> str | None:
    """Why ``config``'s accumulator tile does not fit one CTA's registers (at most 128x256, which needs 8
    warps), or None."""
    if config.block_m * config.block_n > 128 * 256:
        return f"block_m x block_n: {config.block_m}x{config.block_n} exceeds the register budget"
    if config.block_m * config.block_n >= 128 * 256 and config.num_warps < 8:
        return "num_warps: a 128x256 tile needs 8 warps"
    return None


def smem_error(config: Any, elem_bytes: int, budget: int) -> str | None:
    """Why ``config``'s pipeline does not fit ``budget`` bytes of shared memory (:func:`smem_bytes`), or
    None."""
    smem = smem_bytes(config, elem_bytes)
    if smem > budget:
        return f"num_stages: {config.num_stages} stages need {smem} B of shared memory"
    return None


@dataclass(frozen=True)
class TileConfig:
    """Tiles and pipeline of a persistent Triton GEMM: the fields every GEMM config here shares."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        validate_tiles(self)


@dataclass(frozen=True)
class GemmConfig(TileConfig):
    """Tile sizes and schedule of the persistent GEMM (``num_programs=0``: one CTA per SM)."""

    num_programs: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        super().validate()
        if self.num_programs < 0:
            raise ValueError(f"num_programs: must be >= 0, got {self.num_programs}")


def num_sms(device) -> int:
    """Multiprocessor count of ``device`` (a small fixed count on CPU, for the interpreter)."""
    import torch

    if device.type == "cpu":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemm(a, b, out, config: GemmConfig | None = None):
    """``out = a @ b`` with the persistent GEMM; ``a (M, K)``, ``b (K, N)``, ``out (M, N)``."""
    config = GemmConfig() if config is None else config
    config.validate()
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2:
        raise ValueError("gemm: a, b and out must be 2-D")
    (m, k), (k2, n) = a.shape, b.shape
    if k2 != k or tuple(out.shape) != (m, n):
        raise ValueError(f"gemm: shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)} disagree")
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    programs = min(config.num_programs or num_sms(a.device), tiles)
    _gemm_kernel[(programs,)](
        a,
        b,
        out,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        programs,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        EVEN_K=k % config.block_k == 0,
        EVEN_N=n % config.block_n == 0,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
