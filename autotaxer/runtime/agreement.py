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

:class:`RankAgreement` is the runtime's side (a base of :class:`~autotaxer.runtime.dispatch.Runtime`):
the table every rank serves from, a signature's first call (problem key, decision, which inputs require
grad, the wrapper's arguments), a refused call, and with ``check_calls`` every call.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

from .lookup import Decision
from .table import Table, load_table, merge


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


# -- a runtime's exchanges (off the hot path) -------------------------------------------------------
class RankAgreement:
    """The exchanges of :class:`~autotaxer.runtime.dispatch.Runtime` (whose ``__init__`` makes the state)
    with the other ranks of its group: the table every rank serves from, a signature's first call (key,
    decision, which inputs require grad, the wrapper's arguments), a refused call, and with
    ``check_calls`` every call."""

    config: Any
    group: Any
    ctx: Any
    table: Any
    _watch: Any
    _warned: set[str]

    def _agreed_table(self) -> Table:
        """The table of this config's sources, the same on every rank (collective): when ranks loaded
        different tables, rank 0's; when any rank failed to load, ``ConsensusError`` on every rank."""
        cfg = self.config.table_sources()
        target = self.ctx.target
        table, error, exc = None, None, None
        try:
            table = load_table(cfg, target)
        except Exception as e:  # reported on every rank below, so no rank waits forever
            error, exc = f"{type(e).__name__}: {e}", e
        if self.ctx.world_size == 1:
            if exc is not None:
                raise exc
            return table
        mine = (table.digest if table is not None else None, error)
        everyone = all_gather(mine, self.group)
        failed = [(r, err) for r, (_, err) in enumerate(everyone) if err is not None]
        if failed:
            lines = "; ".join(f"rank {r}: {err}" for r, err in failed)
            raise ConsensusError(f"dispatch: loading the tuning table failed ({lines})") from exc
        digests = {d for d, _ in everyone}
        if len(digests) == 1:
            return table
        self._warn_once(
            "table",
            f"autotaxer: ranks loaded different tuning tables ({len(digests)} distinct); using rank 0's",
        )
        payload = [r.to_dict() for r in table.records.values()] if self.ctx.rank == 0 else None
        payload = broadcast(payload, self.group)
        if self.ctx.rank == 0:
            return table
        from ..records import WinnerRecord

        recs = [WinnerRecord.from_dict(d, where=f"rank 0's table record {i}") for i, d in enumerate(payload)]
        return merge([("rank 0's table", recs)], target, env={}, strict=False)

    def _agree(self, op: str, key, decision, error, exc, grad: tuple = ()) -> Decision:
        """All ranks exchange (key, decision, which inputs require grad, the wrapper's arguments:
        :mod:`.agreement`); raise on every rank or resolve to one decision."""
        from ..ops import get_op

        mine = (key.text if key is not None else None, decision.digest if decision else None, error, grad)
        what = f"dispatch({op!r}) first call of {key.text if key is not None else 'a refused call'}"
        everyone = exchange("dispatch", what, (mine, caller()), self.group, self.config.agree_timeout_s)
        callers = [c for _, c in everyone]
        everyone = [m for m, _ in everyone]
        failed = [(r, e) for r, (_, _, e, _) in enumerate(everyone) if e is not None]
        if failed:
            lines = "; ".join(f"rank {r}: {e}" for r, e in failed)
            raise ConsensusError(f"dispatch({op!r}) failed ({lines})") from exc
        if len({k for k, _, _, _ in everyone}) > 1:
            lines = "; ".join(f"rank {r}: {k}" for r, (k, _, _, _) in enumerate(everyone))
            raise ConsensusError(f"dispatch({op!r}): ranks called with different problems ({lines})")
        if len(set(callers)) > 1:
            lines = "; ".join(f"rank {r}: {_caller_text(c)}" for r, c in enumerate(callers))
            raise ConsensusError(
                f"dispatch({op!r}): ranks called with different arguments for one problem ({lines}); "
                "the results would differ"
            )
        if len({g for _, _, _, g in everyone}) > 1:
            lines = ", ".join(f"rank {r}: {_grad_text(g)}" for r, (_, _, _, g) in enumerate(everyone))
            raise ConsensusError(
                f"dispatch({op!r}): ranks differ in which inputs require grad under grad mode ({lines}); "
                "backward is collective, so every rank must differentiate the same calls in the same inputs"
            )
        if len({d for _, d, _, _ in everyone}) == 1:
            return decision
        # A rank-local difference (variant unavailable on one rank, a record only one rank sees).
        self._warn_once(
            f"decision:{key.text}",
            f"autotaxer: ranks decided differently for {key.text}; using rank 0's decision if every rank "
            "can run it, else the baseline",
        )
        chosen = broadcast(decision if self.ctx.rank == 0 else None, self.group)
        opobj = get_op(op)
        variant = opobj.available_variants(self.ctx.target).get(chosen.variant)
        usable = (
            variant is not None
            and variant.check(key, self.ctx.target, chosen.params) is None
            and not self._watch.is_failed(op, chosen.variant, key.text)
        )
        if all(all_gather(usable, self.group)):
            return chosen
        base = opobj.baseline()
        return Decision(base.name, base.default_params(key, self.ctx.target), "fallback", math.inf, None)

    def _refuse(self, op: str, error: str | Exception) -> NoReturn:
        """Raise for a call whose arguments are not what dispatch (or a wrapper over it) takes, on every
        rank: the others learn it in the exchange of a first call, where they would otherwise wait for
        this one. ``error``: a message (a ``TypeError`` of dispatch's) or the wrapper's exception."""
        exc = error if isinstance(error, Exception) else TypeError(f"dispatch({op!r}): {error}")
        text = f"TypeError: {error}" if isinstance(error, str) else f"{type(exc).__name__}: {exc}"
        if self.world_size > 1:
            if self.table is None:
                self.load()
            self._agree(op, None, None, text, exc)
        raise exc

    def _check_call(self, op: str, tensors: tuple, layout: dict[str, Any]) -> None:
        """``check_calls``: compare this call's signature with every rank's, raising on all when they
        differ (a collective per call)."""
        mine = call_text(op, tensors, layout)
        everyone = all_gather(mine, self.group)
        if len(set(everyone)) > 1:
            lines = "; ".join(f"rank {r}: {c}" for r, c in enumerate(everyone))
            raise ConsensusError(f"dispatch (check_calls): ranks called differently ({lines})")

    def _warn_once(self, tag: str, message: str) -> None:
        """Warn with ``message`` once per runtime and ``tag``."""
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _grad_text(grad: tuple[int, ...]) -> str:
    return "tensor arguments " + ", ".join(str(i + 1) for i in grad) if grad else "none"


def _caller_text(caller: tuple | None) -> str:
    return "dispatch itself" if caller is None else ", ".join(str(a) for a in caller)


def call_text(op: str, tensors: tuple, layout: dict[str, Any]) -> str:
    """One call's signature as text (``check_calls``): op, each tensor's shape, strides, dtype and
    ``requires_grad``, the layout and grad mode."""
    import torch

    parts = [op]
    for t in tensors:
        if isinstance(t, torch.Tensor):
            grad = " requires_grad" if t.requires_grad else ""
            parts.append(f"{tuple(t.shape)} strides {t.stride()} {str(t.dtype).removeprefix('torch.')}{grad}")
        else:
            parts.append(type(t).__name__)
    parts += [f"{k}={v}" for k, v in sorted(layout.items())]
    parts.append("grad mode" if torch.is_grad_enabled() else "no grad")
    return ", ".join(parts)


def all_gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` (rank order); collective."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast(obj: Any, group: Any) -> Any:
    """Rank 0's ``obj`` on every rank; collective."""
    import torch.distributed as dist

    src = 0 if group is None else dist.get_global_rank(group, 0)
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]
