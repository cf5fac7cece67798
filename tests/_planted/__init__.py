"""A planted op, for ``tests/ops/test_planted_op.py``: what adding an op takes, and nothing more.

``planted_gemm/`` is its host folder (the problem, a BSP variant and a Triton variant, its bench parts and
the layer it serves) and ``planted_gemm_kernel.py`` its device module; its registry line is the entry
``planted_gemm=_planted.planted_gemm`` of ``$AUTOTAXER_OPS``, which the spawned ranks and workers inherit.
"""
