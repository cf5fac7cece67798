"""The planted op's device code: a tiled Triton GEMM ``C = A @ B`` (any strides), one program per tile.

Runs under Triton's interpreter on CPU (``TRITON_INTERPRET=1``) and compiled on GPUs."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _gemm(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK + tl.arange(0, BLOCK)
    rn = pid_n * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(rk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(
        c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn,
        c,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def gemm(a: Any, b: Any, out: Any, block: int) -> Any:
    """``out = a @ b`` (2-D, any strides) in ``block``-square tiles; returns ``out``."""
    m, k = a.shape
    n = b.shape[1]
    grid = (triton.cdiv(m, block), triton.cdiv(n, block))
    _gemm[grid](
        a, b, out, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        BLOCK=block,
    )  # fmt: skip
    return out
