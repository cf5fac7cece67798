"""Strided copy-engine copies: ``cuMemcpy2DAsync`` between unified device addresses (peers included).

Kept apart from :mod:`.signal`, whose code the copy-engine variants' shipped records hash.
"""

from __future__ import annotations

from typing import Any

from .signal import _check, _driver, _stream


def memcpy2d_async(
    dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream: Any
) -> None:
    """Copy ``height`` rows of ``width`` bytes from ``src`` (rows ``src_pitch`` bytes apart) to ``dst``
    (rows ``dst_pitch`` bytes apart) with the copy engine, on ``stream``."""
    drv = _driver()
    p = drv.CUDA_MEMCPY2D()
    p.srcMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice = drv.CUdeviceptr(src)
    p.srcPitch = src_pitch
    p.dstMemoryType = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.dstDevice = drv.CUdeviceptr(dst)
    p.dstPitch = dst_pitch
    p.WidthInBytes = width
    p.Height = height
    _check(drv.cuMemcpy2DAsync(p, _stream(stream)), "cuMemcpy2DAsync")
