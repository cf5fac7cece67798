"""The runtimes :func:`~autotaxer.runtime.dispatch.dispatch` serves, one per process group.

A registry apart from :mod:`.dispatch` so that the layers built on it (the custom ops, autograd) find a
group's runtime without importing dispatch, which imports them: dispatch installs its ``Runtime`` as the
factory when it is imported.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

#: group (None = the default group) -> its runtime
RUNTIMES: dict[Any, Any] = {}
_FACTORY: list[Callable[[Any, Any], Any]] = []
#: the recorder of a warm-up's recording step while it runs (``autotaxer.warmup``), else empty
_RECORDER: list[Any] = []


def current_recorder() -> Any:
    """The recorder every runtime reports its decisions to while a warm-up records, or None."""
    return _RECORDER[0] if _RECORDER else None


def set_recorder(recorder: Any) -> None:
    """Report decisions to ``recorder`` from now on (None: stop)."""
    _RECORDER[:] = [] if recorder is None else [recorder]


def install(factory: Callable[[Any, Any], Any]) -> None:
    """Make ``factory(config, group)`` what :func:`init` builds runtimes with."""
    _FACTORY[:] = [factory]


def init(config: Any = None, group: Any = None) -> Any:
    """Create the runtime that dispatch uses for ``group`` (replacing and closing an older one)."""
    if not _FACTORY:
        raise RuntimeError("autotaxer: import autotaxer.runtime.dispatch before creating a runtime")
    old = RUNTIMES.pop(group, None)
    if old is not None:
        old.close()
    rt = _FACTORY[0](config, group)
    RUNTIMES[group] = rt
    atexit.unregister(shutdown)  # registered again, last: it runs before every runtime's own handler
    atexit.register(shutdown)
    return rt


def get_runtime(group: Any = None) -> Any:
    """The runtime dispatch uses for ``group``, if one exists yet."""
    return RUNTIMES.get(group)


def runtime_for(group: Any = None) -> Any:
    """The runtime dispatch uses for ``group``, created with the default config if none yet."""
    rt = RUNTIMES.get(group)
    return rt if rt is not None else init(None, group)


def shutdown() -> None:
    """Close every runtime (persisting misses) and forget them. Also run at exit, before the runtimes'
    own handlers: a runtime of a process group other than the default one holds that group, whose gloo
    threads, still running when the interpreter tears down, abort the process (SIGABRT) even after
    ``destroy_process_group``; forgotten here, the group ends while Python still runs."""
    while RUNTIMES:
        _, rt = RUNTIMES.popitem()
        rt.close()
