"""The tuner: Optuna studies per problem key, trials on a reusable distributed worker group.

``tune(keys, target, db, TuneConfig(...), executor)`` is the library entry point; ``autotaxer tune``
(``autotaxer/cli/tune.py``) wraps it. Executors: :class:`SpawnedGroup` (one spawned process per rank)
and ``distributed.LaunchedGroup`` (inside torchrun/SLURM).
"""

from __future__ import annotations

from .group import GroupError, SpawnedGroup, TrialAborted
from .run import TuneConfig, tune

__all__ = ["GroupError", "SpawnedGroup", "TrialAborted", "TuneConfig", "tune"]
