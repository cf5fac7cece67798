"""``flash_decode`` kernels: split-KV partials and their combine (``partials``, used by BSP) and the one
fused launch that computes, pushes and combines them (``fused``), built from the same device pieces."""
