"""autotaxer: autotuning service for fused multi-GPU kernels.

Heavy dependencies (SQLAlchemy, Optuna, Triton, Iris) are imported lazily so that ``import autotaxer``
and ``dispatch`` stay light.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._problem import DTYPES, ProblemKey, Target

__all__ = ["DTYPES", "ProblemKey", "Runtime", "RuntimeConfig", "Target", "__version__", "dispatch", "init"]

_LAZY = {"dispatch", "init", "Runtime", "RuntimeConfig"}  # from .runtime.dispatch (imports torch)


def __getattr__(name: str):
    if name in _LAZY:
        from .runtime import dispatch as _dispatch_module

        value = getattr(_dispatch_module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
