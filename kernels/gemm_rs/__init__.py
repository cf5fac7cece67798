"""``gemm_rs`` kernels: the fused GEMM + reduce-scatter on the symmetric heap (``push_kernel``; its host
side ``push``)."""
