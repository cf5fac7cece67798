"""The runtimes dispatch serves, one per process group: this registry's one job.

A module apart from :mod:`.dispatch` (which builds them: :func:`~.dispatch.init`) so that what only reads
the registry (:func:`autotaxer.served`, the warm-up's recorder, the async-TP override) needs nothing else.
"""

from __future__ import annotations

import atexit
from typing import Any

#: group (None = the default group) -> its runtime
RUNTIMES: dict[Any, Any] = {}
#: the recorder of a warm-up's recording step while it runs (``autotaxer.warmup``), else empty
_RECORDER: list[Any] = []


def current_recorder() -> Any:
    """The recorder every runtime reports its decisions to while a warm-up records, or None."""
    return _RECORDER[0] if _RECORDER else None


def set_recorder(recorder: Any) -> None:
    """Report decisions to ``recorder`` from now on (None: stop)."""
    _RECORDER[:] = [] if recorder is None else [recorder]


def add_runtime(group: Any, rt: Any) -> Any:
    """Make ``rt`` the runtime of ``group`` (closing the one it replaces) and return it."""
    old = RUNTIMES.pop(group, None)
    if old is not None:
        old.close()
    RUNTIMES[group] = rt
    atexit.unregister(shutdown)  # registered again, last: it runs before every runtime's own handler
    atexit.register(shutdown)
    return rt


def get_runtime(group: Any = None) -> Any:
    """The runtime dispatch uses for ``group``, if one exists yet."""
    return RUNTIMES.get(group)


def shutdown() -> None:
    """Close every runtime (persisting misses) and forget them. Also run at exit, before the runtimes'
    own handlers: a runtime of a process group other than the default one holds that group, whose gloo
    threads, still running when the interpreter tears down, abort the process (SIGABRT) even after
    ``destroy_process_group``; forgotten here, the group ends while Python still runs."""
    while RUNTIMES:
        _, rt = RUNTIMES.popitem()
        rt.close()
