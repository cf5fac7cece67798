"""Keep the default process group releasable by ``destroy_process_group``.

``torch.distributed.nn.functional`` writes ``group=group.WORLD`` as default arguments, evaluated when it is
imported: imported while a process group exists (``torch._dynamo`` imports it, so the first
``torch.compile`` or custom op after ``init_process_group`` does), its functions keep that group alive after
``destroy_process_group``. The group's gloo threads then still run at interpreter exit, where the C++
runtime's teardown aborts about one exit in five to twenty (``terminate called without an active
exception``, SIGABRT, torchrun exits 1; measured on torch 2.13, CPU, 2 gloo ranks).

:func:`release_default_group` imports that module now: before any group exists its defaults are
``None`` (the default group, looked up at each call), as torch means them; after, a pinned group in
them is put back to ``None``, the same meaning. Every later import finds the module already loaded.
"""

from __future__ import annotations

from types import FunctionType

__all__ = ["release_default_group"]


def release_default_group() -> None:
    """Make sure no default argument of ``torch.distributed.nn.functional`` holds a process group."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    import torch.distributed.nn.functional as functional

    for fn in vars(functional).values():
        defaults = fn.__defaults__ if isinstance(fn, FunctionType) else None
        if defaults and any(isinstance(d, dist.ProcessGroup) for d in defaults):
            fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)
