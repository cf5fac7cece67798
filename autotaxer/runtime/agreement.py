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

:func:`exchange` is the one collective these comparisons use: every rank sends what it is at (a first
call of dispatch, the end of a warm-up's step) with its payload. Ranks at different exchanges (one rank
dispatching a call its peers never make while they have moved on to the warm-up's end) meet in it and
raise :class:`OutOfStepError` on every rank, naming what each rank was at, instead of waiting forever or
reading each other's payloads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn


class ConsensusError(RuntimeError):
    """Ranks cannot agree (a rank failed to load its table, or ranks called with different problems)."""


class OutOfStepError(ConsensusError):
    """Ranks met in one collective while at different exchanges (see :func:`exchange`); every rank raises
    it, and none makes the collective it was at again (its peers are no longer there)."""


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


def exchange(kind: str, what: str, payload: Any, group: Any) -> list[Any]:
    """Every rank's ``payload`` (rank order) of the exchange ``kind`` (``"dispatch"``, ``"warmup"``);
    collective. ``what`` says what this rank is at (``dispatch('ag_gemm') first call of <key>``).
    :class:`OutOfStepError` on every rank when a rank is at another exchange."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (kind, what, payload), group=group)
    if any(k != kind for k, _, _ in everyone):
        lines = "; ".join(f"rank {r}: {w}" for r, (_, w, _) in enumerate(everyone))
        raise OutOfStepError(
            f"ranks are out of step ({lines}): they made different collective calls (a call only some "
            "ranks made, or a step that dispatched differently on each rank)"
        )
    return [p for _, _, p in everyone]
