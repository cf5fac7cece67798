"""Opt-in ``ag_gemm`` variants (``push_ws``, ``push_ws_fwd``, ``ce_fanout``, ``ce_grouped``,
``ce_persistent``, ``ce_pull``, ``ce_local_rest``) and ``push_ws``'s emulated pair: registered, but tuned
and benchmarked only when named (``--variants``), except the copy-engine schedules for many peers from the
world size ``AgGemm.default_from_world_size`` gives. Stable modules never import this package."""
