"""Shared pytest set-up: the ``gpu`` marker skips cleanly where no GPU is visible; one Triton-interpreter
process serves every interpreter test (``interpreter_worker``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover - torch missing is a set-up error reported elsewhere
        return 0


def pytest_collection_modifyitems(config, items):
    n = _gpus()
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = int(marker.kwargs.get("world_size", 1))
        if n < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPU(s), {n} visible"))


@pytest.fixture(scope="session")
def interpreter_worker() -> Iterator:
    """One ``TRITON_INTERPRET=1`` process running every interpreter test's script in turn (starting one
    costs seconds: the tests of tests/ops started one per check)."""
    from autotaxer.testing.interpreter import InterpreterWorker

    with InterpreterWorker() as worker:
        yield worker
