"""Shared pytest set-up: the tests never write into the user's home (a private home, data and cache
folders for the session, a data folder of its own for each test, and a test fails that changed a watched
place of the real home); the ``gpu`` marker skips cleanly where no GPU is visible; the longest tests run
first (with ``-n``, workers then end together); one Triton-interpreter process serves every interpreter
test (``interpreter_worker``); pytest's summary is the last line."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterator

import _home
import pytest


def pytest_configure(config) -> None:
    _home.enter_private_home()


@pytest.fixture(autouse=True)
def _own_data_folder(tmp_path_factory, monkeypatch) -> Iterator[None]:
    """Each test its own ``$XDG_DATA_HOME`` (default database and misses file); the test fails if it
    wrote into a watched place of the user's real home."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
    before = _home.watched_state()
    yield
    changed = _home.changed_since(before)
    if changed:
        where = ", ".join(changed)  # a process outside this run can write there too: run the suite alone
        pytest.fail(
            f"the test wrote into the user's home (or a process outside the tests did): {where}",
            pytrace=False,
        )


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover - torch missing is a set-up error reported elsewhere
        return 0


#: The longest tests (a minute or more on 2 cores), started first; then the other ``slow`` ones.
LONGEST = (
    "test_readme.py::", "test_random_kills", "test_a_layers_keys_are_recorded", "test_a_rank_killed_mid",
    "test_the_readme_model_exits_0_in_20_launches",
)  # fmt: skip


def _start_order(item) -> int:
    if any(name in item.nodeid for name in LONGEST):
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_order)  # stable: the collection order within each group
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


def pytest_unconfigure(config) -> None:
    """Remove the session's private folder; keep pytest's summary the run's last line: at interpreter
    shutdown libtriton (nanobind bindings) reports some 300 "leaked" functions, types and IR attributes of
    the compiled kernels, a known report that Triton silences in its own compile workers the same way
    (stderr closed at exit)."""
    _home.leave_private_home()
    atexit.register(_quiet_triton_shutdown)


def _quiet_triton_shutdown() -> None:
    if any(name.startswith("triton._C.libtriton") for name in sys.modules):
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
