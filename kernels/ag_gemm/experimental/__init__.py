"""Opt-in ``ag_gemm`` kernels (``push_ws``'s warp-specialised Gluon GEMM, ``ce_fanout``'s multi-stream
copy engine): tuned only when named (``--variants``); nothing stable imports them."""
