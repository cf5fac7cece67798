"""What the ranks of a group agree on at a signature's first call, beyond dispatch's own arguments.

A wrapper over dispatch (the torch-signature functions, the layers) checks arguments that dispatch never
sees and reshapes its inputs into an op's 2-D problem, so two ranks can call it differently and still
reach dispatch with the same problem. Two helpers keep every rank ending together:

- :func:`refuse`: a wrapper's argument error, raised on every rank. The rank that finds it takes part in
  the exchange its peers are waiting in (the first call of a signature) with the error, so every rank
  raises :class:`~autotaxer.runtime.dispatch.ConsensusError` naming the rank and the reason; on one rank
  the error itself is raised.
- :func:`calling`: the wrapper's own arguments that change the result (``fused_all_gather_matmul``'s
  A_shard shape and ``gather_dim``), carried into that exchange and compared there with the problem key.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

#: the wrapper call being served (its arguments that change the result), compared at a first call
_CALLER: ContextVar[tuple | None] = ContextVar("autotaxer_caller", default=None)


def caller() -> tuple | None:
    """The arguments of the wrapper call dispatch is serving now, or None (a direct dispatch call)."""
    return _CALLER.get()


@contextmanager
def calling(*arguments: Any) -> Iterator[None]:
    """Within the block, dispatch's first-call exchange also compares ``arguments`` (picklable values
    that change the result, e.g. ``("fused_all_gather_matmul", shape, gather_dim)``) across ranks."""
    token = _CALLER.set(arguments)
    try:
        yield
    finally:
        _CALLER.reset(token)


def refuse(op: str, group: Any, error: Exception) -> NoReturn:
    """Raise ``error`` (a wrapper's argument check of ``op``) on every rank of ``group``; collective
    where peers wait: see the module docstring."""
    import torch
    import torch.distributed as dist

    from ._runtimes import runtime_for

    if torch.compiler.is_compiling():  # a trace: every rank traces the same code and raises alike
        raise error
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        raise error
    runtime_for(group)._refuse(op, error)
    raise error  # _refuse raises; this line keeps the type checker's NoReturn honest


def check_dim(name: str, value: Any, ndim: int, what: str) -> str | None:
    """Why ``value`` is not a dimension index of a ``ndim``-D ``what`` (``None`` when it is)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}: expected an int dimension, got {type(value).__name__} {value!r}"
    if not -ndim <= value < ndim:
        return f"{name}: {value} is not a dimension of a {ndim}-D {what}"
    return None
