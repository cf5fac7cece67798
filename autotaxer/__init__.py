"""autotaxer: autotuning service for fused multi-GPU kernels.

Heavy dependencies (SQLAlchemy, Optuna, Triton, Iris) are imported lazily so that ``import autotaxer``
and ``dispatch`` stay light.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import Any

from ._problem import DTYPES, ProblemKey, Target

__all__ = [
    "DTYPES", "ConsensusError", "OutOfStepError", "PeerTimeoutError", "ProblemKey", "Runtime",
    "RuntimeConfig", "Target", "__version__",
    "async_tp", "check", "dispatch", "fused_all_gather_matmul", "fused_matmul_reduce_scatter", "init", "nn",
    "served", "warmup",
]  # fmt: skip

# name -> module it comes from; imported on first use (they import torch)
_LAZY = {
    "dispatch": ".integrations.dispatch",
    "init": ".runtime.dispatch",
    "Runtime": ".runtime.dispatch",
    "RuntimeConfig": ".runtime.dispatch",
    "check": ".ops._peer_wait",
    "PeerTimeoutError": ".ops._peer_wait",
    # raised on every rank when ranks call differently (README, troubleshooting)
    "ConsensusError": ".runtime.agreement",
    "OutOfStepError": ".runtime.agreement",
    "fused_all_gather_matmul": ".functional",
    "fused_matmul_reduce_scatter": ".functional",
    "warmup": ".tuner.warmup",
    # served(since=None) -> list of Served rows: per problem key and call path (dispatch, function,
    # compiled, backward, async_tp, traced), which variant served how many calls, and whether that was
    # the tuned winner, an untuned key's fallback, or a fall-back for a call needing the gathered A.
    "served": ".runtime.served",
}


def _miss_tuner(config: Any) -> Any:
    """The tuner of ``RuntimeConfig(tune_misses=...)`` (an :class:`~autotaxer.tuner.in_group.InlineTuner`
    for the runtime's ``config``): the package, above both, wires the runtime to the tuner here, so the
    runtime asks for it (``Runtime._tune_inline``) and never imports the tuner."""
    from .tuner.in_group import InlineTuner

    return InlineTuner(config)


def __getattr__(name: str):
    import importlib

    if name in ("nn", "async_tp"):
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
