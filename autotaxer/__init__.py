"""autotaxer: autotuning service for fused multi-GPU kernels.

Heavy dependencies (SQLAlchemy, Optuna, Triton, Iris) are imported lazily so that ``import autotaxer``
and ``dispatch`` stay light.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._problem import DTYPES, ProblemKey, Target

__all__ = ["DTYPES", "ProblemKey", "Target", "__version__"]
