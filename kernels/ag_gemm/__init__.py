"""``ag_gemm`` kernels: the fused Iris kernel (``fused_kernel``; its host side ``fused``, its TMA consumer
``fused_tma``) behind ``push``, ``pull`` and ``push_tma``, and the copy-engine pipeline
(``copy_engine``). ``experimental/`` holds kernels no stable variant imports."""
