"""Opt-in ``ag_gemm`` variants (``push_ws``, ``push_ws_fwd``, ``ce_fanout``) and ``push_ws``'s emulated
pair: registered, but tuned and benchmarked only when named (``--variants``). Stable modules never
import this package."""
