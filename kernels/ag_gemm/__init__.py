"""``ag_gemm`` kernels: the fused Iris kernel (``fused_kernel``; its argument groups ``args``, its host side
``fused``, its consumers ``consume`` and ``consume_tma``) behind ``push``, ``pull`` and ``push_tma``, and the
copy-engine schedule (``copy_engine``). ``experimental/`` holds kernels no stable variant imports."""
