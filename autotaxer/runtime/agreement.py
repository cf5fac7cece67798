"""What the ranks of a group agree on at a signature's first call, beyond dispatch's own arguments.

A wrapper over dispatch (the torch-signature functions, the layers) checks arguments that dispatch never
sees and reshapes its inputs into an op's 2-D problem, so two ranks can call it differently and still
reach dispatch with the same problem. Two helpers keep every rank ending together:

- a wrapper's argument error, raised on every rank (``Runtime._refuse``, which the wrappers reach through
  :func:`autotaxer.integrations._signature.refuse`). The rank that finds it takes part in
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

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


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


def calling(*arguments: Any) -> contextlib.AbstractContextManager[None]:
    """Within the block, dispatch's first-call exchange also compares ``arguments`` (picklable values
    that change the result, e.g. ``("fused_all_gather_matmul", shape, gather_dim)``) across ranks. While
    ``torch.compile`` traces, nothing (the custom op decides at run time, where no wrapper is called)."""
    import torch

    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return _calling(arguments)


@contextmanager
def _calling(arguments: tuple) -> Iterator[None]:
    token = _CALLER.set(arguments)
    try:
        yield
    finally:
        _CALLER.reset(token)


def check_dim(name: str, value: Any, ndim: int, what: str) -> str | None:
    """Why ``value`` is not a dimension index of a ``ndim``-D ``what`` (``None`` when it is)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name}: expected an int dimension, got {type(value).__name__} {value!r}"
    if not -ndim <= value < ndim:
        return f"{name}: {value} is not a dimension of a {ndim}-D {what}"
    return None


#: the longest a rank waits at an exchange for its peers to come to it (RuntimeConfig.agree_timeout_s)
AGREE_TIMEOUT_S = 600.0
#: exchanges made so far on each group (by name): every rank of a group makes the same ones in order
_MADE: dict[str, int] = {}


def exchange(kind: str, what: str, payload: Any, group: Any, timeout_s: float = AGREE_TIMEOUT_S) -> list[Any]:
    """Every rank's ``payload`` (rank order) of the exchange ``kind`` (``"dispatch"``, ``"warmup"``);
    collective. ``what`` says what this rank is at (``dispatch('ag_gemm') first call of <key>``).

    The ranks first meet in the process group's store (:func:`_meet`), not in a collective of the group:
    a peer busy in an op's collective (a call it served from its cache) is then never paired with this
    exchange's. :class:`OutOfStepError` on every rank at it when a rank is at another exchange, and on
    this rank when a peer has not come within ``timeout_s``."""
    import torch.distributed as dist

    _meet(kind, what, group, timeout_s)
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (kind, what, payload), group=group)
    if any(k != kind for k, _, _ in everyone):
        lines = "; ".join(f"rank {r}: {w}" for r, (_, w, _) in enumerate(everyone))
        raise OutOfStepError(
            f"ranks are out of step ({lines}): they made different collective calls (a call only some "
            "ranks made, or a step that dispatched differently on each rank)"
        )
    return [p for _, _, p in everyone]


def _meet(kind: str, what: str, group: Any, timeout_s: float) -> None:
    """Wait (at most ``timeout_s``) in the store until every rank of ``group`` has come to this exchange
    (the group's next one), then compare what each is at. A peer that never comes is in a collective
    this rank did not make: the group is out of step for good, so it is shut down here (a peer waiting in
    a collective of it then fails at once instead of at the group's own timeout) and this rank raises."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    try:
        store = c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):  # no store to meet in: the collective alone
        return
    name = (group if group is not None else dist.group.WORLD).group_name
    n = _MADE.get(name, 0)
    _MADE[name] = n + 1
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    keys = [f"autotaxer/agree/{name}/{n}/{r}" for r in range(size)]
    store.set(keys[rank], f"{kind}\n{what}")
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError:  # the store's timeout (DistStoreError): who never came
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        if not missing:
            raise
        with contextlib.suppress(Exception):  # what the peers' failing collectives then name
            store.set(_left_key(name), f"rank {rank} left the group at {what}")
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)
        raise OutOfStepError(
            f"ranks are out of step: rank(s) {', '.join(map(str, missing))} did not come to this exchange "
            f"within {timeout_s:g} s (rank {rank}: {what}). A rank that calls a shape it called before runs "
            "its kernel at once, without exchanging anything: when a peer calls differently (another shape, "
            "an argument error, requires_grad on one rank), they wait for each other in different places. "
            "The process group was shut down; RuntimeConfig(check_calls=True) names the differing call"
        ) from None
    if n:
        store.delete_key(f"autotaxer/agree/{name}/{n - 1}/{rank}")  # every peer has read it: it is here
    seen = [v.decode().split("\n", 1) for v in store.multi_get(keys)]
    if any(k != kind for k, _ in seen):
        lines = "; ".join(f"rank {r}: {w}" for r, (_, w) in enumerate(seen))
        raise OutOfStepError(
            f"ranks are out of step ({lines}): they made different collective calls (a call only some "
            "ranks made, or a step that dispatched differently on each rank)"
        )


def _left_key(name: str) -> str:
    return f"autotaxer/out_of_step/{name}"


def raise_if_peer_left(group: Any, error: BaseException) -> None:
    """Raise :class:`OutOfStepError` from ``error`` (a call of this rank that failed) when a peer left
    ``group`` out of step (:func:`_meet` shut it down): the call failed because the peer's collective was
    another one, and this says so on this rank too. Returns when no peer left (the call's error stands)."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    try:
        store = c10d._get_default_store()
        key = _left_key((group if group is not None else dist.group.WORLD).group_name)
        if not store.check([key]):
            return
        store.set_timeout(timedelta(seconds=5))
        text = store.get(key).decode()
    except Exception:  # no store, or it went with the group: the call's own error stands
        return
    raise OutOfStepError(
        f"ranks are out of step: {text}, while this rank served a call it had made before, so this call "
        f"failed ({type(error).__name__}: {error}). RuntimeConfig(check_calls=True) names the differing call"
    ) from error
