"""Split-KV flash decode on one rank's KV shard, and the log-sum-exp combine of partials.

``decode_partials`` computes, for every (batch row, KV head, split), the attention of the group of
``H // Hkv`` query heads over one contiguous piece of this rank's valid KV prefix: a normalised partial
output ``O`` (fp32) and its log-sum-exp in base 2 (``-inf`` for an empty piece, with ``O = 0``).
``combine_partials`` merges ``P = world_size * splits`` partials per (row, head) into the output.
BSP runs them as local kernel -> all-gather of (O, LSE) -> combine; the fused kernel in
:mod:`.fused` reuses the same ``@triton.jit`` bodies.

Layouts: ``q (B, H, D)``, ``k``/``v`` ``(B, S_local, Hkv, D)`` with unit stride along ``D``, ``lengths
(B,)`` int32 = valid positions of each row in this shard (a prefix). Query head ``h`` attends with KV
head ``h // (H // Hkv)``. Split-KV decode is memory bound: the tile of 16 padded query rows per KV head
costs MMA work that the HBM stream hides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
#: Head dimensions the kernels accept (powers of two; the op admits 64 and 128).
HEAD_DIMS = (64, 128)
#: Largest number of partials one combine merges (world size x splits).
MAX_PARTIALS = 1024


@dataclass(frozen=True)
class DecodeConfig:
    """Meta-parameters of the local decode: KV block size, splits per rank, warps, pipeline stages."""

    block_n: int = 64
    splits: int = 16
    num_warps: int = 4
    num_stages: int = 2

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_n: must be a power of two in 16..256, got {self.block_n}")
        if not 1 <= self.splits <= 256:
            raise ValueError(f"splits: must be in 1..256, got {self.splits}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"num_stages: must be in 1..8, got {self.num_stages}")


class Kv(NamedTuple):
    """The decode's inputs, as its kernels take them: ``q (B, H, D)``, ``k``/``v`` ``(B, S_local, Hkv, D)``
    and the valid ``lengths (B,)``."""

    q: Any
    k: Any
    v: Any
    lengths: Any


class KvStrides(NamedTuple):
    """Strides of ``q`` (row, head), ``k`` and ``v`` (row, position, KV head); ``D`` is unit stride."""

    qb: int
    qh: int
    kb: int
    ks: int
    kh: int
    vb: int
    vs: int
    vh: int


class KvMeta(NamedTuple):
    """Constexpr: query heads per KV head, the padded query tile, the KV block, the head dim, and whether
    the dots run in IEEE fp32 (fp32 inputs)."""

    GROUP: int
    BLOCK_G: int
    BLOCK_N: int
    HEAD_DIM: int
    IEEE: bool


def block_g(group: int) -> int:
    """Rows of the query tile: the GQA group padded to a power of two of at least 16 (``tl.dot``)."""
    return max(16, triton.next_power_of_2(group))


def block_p(partials: int) -> int:
    """Partials merged per step of the combine loop."""
    return min(32, triton.next_power_of_2(partials))


# -- device bodies ---------------------------------------------------------------------------------
@triton.jit
def split_bounds(length, split, splits, BLOCK_N: tl.constexpr):
    """``[start, end)`` of split ``split`` of a valid prefix of ``length``: equal BLOCK_N-aligned pieces."""
    per = tl.cdiv(tl.cdiv(length, splits), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, length)
    return start, end


@triton.jit
def partial_attention(kv, item, num_kv_heads, splits, strides, qk_scale, META: tl.constexpr):
    """Partial attention of work item ``item = (b * num_kv_heads + kvh) * splits + split``: the ``GROUP``
    query heads of KV head ``kvh`` of row ``b`` over split ``split`` of the row's valid prefix (``kv``:
    :class:`Kv`, ``strides``: :class:`KvStrides`, ``META``: :class:`KvMeta`).

    Returns ``(b, kvh, split, o, lse)``: ``o (BLOCK_G, HEAD_DIM)`` fp32 normalised, ``lse (BLOCK_G,)`` in
    base 2; an empty split gives ``o = 0`` and ``lse = -inf``. ``qk_scale`` is ``log2(e) / sqrt(D)``.
    """
    GROUP: tl.constexpr = META.GROUP  # shapes take constexprs (a group's field is a plain value)
    BLOCK_G: tl.constexpr = META.BLOCK_G
    BLOCK_N: tl.constexpr = META.BLOCK_N
    HEAD_DIM: tl.constexpr = META.HEAD_DIM
    split = item % splits
    bk = item // splits
    b = bk // num_kv_heads
    kvh = bk % num_kv_heads
    start, end = split_bounds(tl.load(kv.lengths + b), split, splits, BLOCK_N)
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    q_rows = b64 * strides.qb + (kvh * GROUP + offs_g).to(tl.int64) * strides.qh
    q = tl.load(kv.q + q_rows[:, None] + offs_d[None, :], mask=(offs_g < GROUP)[:, None], other=0.0)
    k_base = kv.k + b64 * strides.kb + kvh.to(tl.int64) * strides.kh
    v_base = kv.v + b64 * strides.vb + kvh.to(tl.int64) * strides.vh
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        valid = pos < end
        pos64 = pos.to(tl.int64)
        k = tl.load(k_base + pos64[:, None] * strides.ks + offs_d[None, :], mask=valid[:, None], other=0.0)
        if META.IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # finite: every block of a non-empty range has a valid column
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, 1)
        v = tl.load(v_base + pos64[:, None] * strides.vs + offs_d[None, :], mask=valid[:, None], other=0.0)
        if META.IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m = m_new
    nonempty = l_sum > 0.0
    o = acc / tl.where(nonempty, l_sum, 1.0)[:, None]
    lse = tl.where(nonempty, m + tl.log2(tl.where(nonempty, l_sum, 1.0)), float("-inf"))
    return b, kvh, split, o, lse


@triton.jit
def combine_head(
    o_base,
    lse_base,
    num_partials,
    splits,
    o_stride_rank,
    o_stride_split,
    lse_stride_rank,
    lse_stride_split,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Merge the partials ``p = rank * splits + split`` of one (row, head) into its fp32 output.

    Loads bypass L1 (``.cg``): in the fused kernel the partials were written by peers over NVLink.
    All-empty partials give 0 (not NaN).
    """
    offs_p = tl.arange(0, BLOCK_P)
    offs_d = tl.arange(0, HEAD_DIM)
    m = float("-inf")
    den = 0.0
    num = tl.zeros((HEAD_DIM,), tl.float32)
    for p0 in range(0, num_partials, BLOCK_P):
        p = p0 + offs_p
        live = p < num_partials
        r = (p // splits).to(tl.int64)
        s = (p % splits).to(tl.int64)
        lse = tl.load(
            lse_base + r * lse_stride_rank + s * lse_stride_split,
            mask=live,
            other=float("-inf"),
            cache_modifier=".cg",
        )
        o_rows = o_base + r * o_stride_rank + s * o_stride_split
        o = tl.load(o_rows[:, None] + offs_d[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_ref)
        w = tl.exp2(lse - m_ref)
        num = num * alpha + tl.sum(w[:, None] * o, 0)
        den = den * alpha + tl.sum(w, 0)
        m = m_new
    return tl.where(den > 0.0, num / tl.where(den > 0.0, den, 1.0), 0.0)


@triton.jit
def _split_kv_kernel(kv, o_ptr, lse_ptr, num_kv_heads, splits, strides, qk_scale, META: tl.constexpr):
    GROUP: tl.constexpr = META.GROUP
    BLOCK_G: tl.constexpr = META.BLOCK_G
    HEAD_DIM: tl.constexpr = META.HEAD_DIM
    b, kvh, split, o, lse = partial_attention(
        kv, tl.program_id(0), num_kv_heads, splits, strides, qk_scale, META
    )
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    # partial layout (B, H, splits, D) / (B, H, splits): row = b * H + h
    row = (b * num_kv_heads * GROUP + kvh * GROUP + offs_g).to(tl.int64) * splits + split
    g_ok = offs_g < GROUP
    tl.store(o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=g_ok[:, None])
    tl.store(lse_ptr + row, lse, mask=g_ok)


@triton.jit
def _combine_kernel(
    o_ptr,
    lse_ptr,
    out_ptr,
    num_heads,
    splits,
    num_partials,
    stride_rank,
    stride_out_b,
    stride_out_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // num_heads
    h = pid % num_heads
    row = pid.to(tl.int64) * splits  # (b * H + h) * splits
    res = combine_head(
        o_ptr + row * HEAD_DIM, lse_ptr + row, num_partials, splits, stride_rank, HEAD_DIM, stride_rank, 1,
        HEAD_DIM, BLOCK_P,
    )  # fmt: skip
    out = out_ptr + b.to(tl.int64) * stride_out_b + h.to(tl.int64) * stride_out_h + tl.arange(0, HEAD_DIM)
    tl.store(out, res.to(out_ptr.dtype.element_ty))


# -- launchers -------------------------------------------------------------------------------------
def check_decode_inputs(q, k, v, lengths) -> tuple[int, int, int, int, int]:
    """Validate shapes, dtypes and strides; return ``(B, H, Hkv, D, S_local)``."""
    import torch

    if q.dim() != 3 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q must be (B, H, D) and k, v (B, S, Hkv, D); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, d = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v shape {tuple(k.shape)}/{tuple(v.shape)} does not match q {tuple(q.shape)}")
    hkv = k.shape[2]
    if hkv == 0 or h % hkv:
        raise ValueError(f"H: {h} query heads are not a multiple of Hkv={hkv}")
    if d not in HEAD_DIMS:
        raise ValueError(f"D: head dim must be one of {HEAD_DIMS}, got {d}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"dtype: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("stride: q, k and v need unit stride along D")
    if lengths.dtype != torch.int32 or tuple(lengths.shape) != (b,):
        raise ValueError(
            f"lengths: expected int32 of shape ({b},), got {lengths.dtype} {tuple(lengths.shape)}"
        )
    return b, h, hkv, d, k.shape[1]


_FP32 = torch.float32


def kv_args(q, k, v, lengths, config: DecodeConfig) -> tuple[Kv, KvStrides, float, KvMeta]:
    """The split-KV body's arguments for checked inputs: ``(kv, strides, qk_scale, META)`` (every launch
    builds them: positional, no keyword binding)."""
    group, d = q.shape[1] // k.shape[2], q.shape[2]
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    strides = KvStrides(qs[0], qs[1], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2])
    meta = KvMeta(group, block_g(group), config.block_n, d, q.dtype == _FP32)
    return Kv(q, k, v, lengths), strides, LOG2E / d**0.5, meta


def decode_partials(q, k, v, lengths, o_part, lse_part, *, config: DecodeConfig) -> None:
    """Write this shard's partials: ``o_part (B, H, splits, D)`` fp32, ``lse_part (B, H, splits)`` fp32."""
    import torch

    b, h, hkv, d, _ = check_decode_inputs(q, k, v, lengths)
    s = config.splits
    if o_part.dtype != torch.float32 or o_part.numel() != b * h * s * d or not o_part.is_contiguous():
        raise ValueError(f"o_part: expected contiguous fp32 with {b * h * s * d} elements")
    if lse_part.dtype != torch.float32 or lse_part.numel() != b * h * s or not lse_part.is_contiguous():
        raise ValueError(f"lse_part: expected contiguous fp32 with {b * h * s} elements")
    kv, strides, qk_scale, meta = kv_args(q, k, v, lengths, config)
    _split_kv_kernel[(b * hkv * s,)](
        kv,
        o_part,
        lse_part,
        hkv,
        s,
        strides,
        qk_scale,
        META=meta,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def combine_partials(
    o_all, lse_all, out, *, world_size: int, splits: int, stride_rank: int, num_warps: int = 4
) -> None:
    """Merge partials laid out per rank as ``(B, H, splits, D)`` / ``(B, H, splits)``, ``stride_rank``
    elements apart (the same stride for O and LSE: one all-gathered buffer), into ``out (B, H, D)``."""
    b, h, d = out.shape
    if out.stride(2) != 1:
        raise ValueError("out: needs unit stride along D")
    p = world_size * splits
    if p > MAX_PARTIALS:
        raise ValueError(f"splits: world_size * splits = {p} exceeds {MAX_PARTIALS}")
    _combine_kernel[(b * h,)](
        o_all,
        lse_all,
        out,
        h,
        splits,
        p,
        stride_rank,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=d,
        BLOCK_P=block_p(p),
        num_warps=num_warps,
    )
