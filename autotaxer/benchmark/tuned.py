"""Tuned configurations of a benchmark's cases, from the tuning database: what each variant is timed at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .case import Case

#: Tuned configurations: case index -> variant name -> params.
Tuned = Mapping[int, Mapping[str, Mapping[str, Any]]]


def tuned_params(db: Any, cases: Iterable[Case], gpu_model: str, world_size: int) -> dict[int, dict]:
    """Per case, each variant's best COMPLETE trial in its Optuna study, and the stored winner.

    ``db`` is an open :class:`autotaxer.storage.Database`. Cases without a study or winner are absent.
    """
    import optuna

    from ..tuner.study import best_trial, split_params

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = db.optuna_storage()
    names = set(optuna.get_all_study_names(storage)) if storage is not None else set()
    out: dict[int, dict] = {}
    for i, case in enumerate(cases):
        key = case.key(gpu_model, world_size)
        found: dict[str, dict] = {}
        if key.text in names:
            study = optuna.load_study(study_name=key.text, storage=storage)
            for variant in {t.params.get("variant") for t in study.get_trials(deepcopy=False)} - {None}:
                best = best_trial(study, variant)
                if best is not None:
                    found[variant] = split_params(best.params)[1]
        winner = db.get_winner(key)
        if winner is not None:
            found.setdefault(winner.variant, dict(winner.params))
        if found:
            out[i] = found
    return out
