"""A runtime's device context and the table it serves from: set up at its first call (collective), then
changed only by tuning in the model's processes (:meth:`RuntimeSetup.use_database`,
:meth:`RuntimeSetup.install_records`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops._peer_wait import peer_watch
from .config import RuntimeConfig
from .table import Table


class RuntimeSetup:
    """The set-up part of :class:`~autotaxer.runtime.dispatch.Runtime` (whose ``__init__`` makes the
    state): the run context (device, target, rank, Iris environment, bounds of waits on peers), the peer
    watch and the table every rank agreed on (:class:`~autotaxer.runtime.agreement.RankAgreement`)."""

    config: RuntimeConfig
    group: Any
    ctx: Any
    table: Table | None
    _watch: Any

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self.ctx.rank if self.ctx is not None else group_rank(self.group)[0]

    @property
    def world_size(self) -> int:
        """Ranks of the group."""
        return self.ctx.world_size if self.ctx is not None else group_rank(self.group)[1]

    def load(self, device: Any = None) -> Table:
        """Set up the context for ``device`` (default: the current CUDA device, else CPU) and load the table.

        Collective. Every rank loads its sources; if their digests differ, rank 0's table is used by all
        (with a warning); if any rank fails to load, every rank raises :class:`ConsensusError`.
        """
        if self.table is not None:
            return self.table
        self._setup_context(device)
        self.table = self._agreed_table()
        return self.table

    def _setup_context(self, device: Any) -> None:
        from .._target import cpu_target, cuda_target
        from ..ops import RunContext

        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda":
            from ..ops._iris_heap import configure_iris_environment

            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            configure_iris_environment()
            target = cuda_target(device.index)
        else:
            target = cpu_target()
        rank, world_size = group_rank(self.group)
        self.ctx = RunContext(
            rank=rank,
            world_size=world_size,
            device=device,
            target=target,
            group=self.group,
            heap_size=self.config.heap_size,
            peer_timeout_s=self.config.peer_timeout(),
            first_call_timeout_s=self.config.first_call_timeout_s,
        )
        self._watch = peer_watch(device)

    def install_records(self, records: Any, origin: str) -> None:
        """Serve ``records`` (winners tuned in this group, the same on every rank) from their keys' next
        call: they join the table as records of ``origin`` and their keys are forgotten."""
        from ..records import timing_of

        keys = []
        for rec in records:
            if self.config.timing is None or timing_of(rec.env) == self.config.timing:
                self.table.records[rec.key] = rec
                self.table.origins[rec.key] = origin
                keys.append(rec.key)
        self.forget(keys)

    def use_database(self, url: str) -> None:
        """Make ``url`` this runtime's database (a table source below explicit tables); collective. When
        the table changes, every decision is made again."""
        import dataclasses

        if self.config.db_url == url and self.table is not None:
            return
        self.config = dataclasses.replace(self.config, db_url=url)
        if self.table is None:
            return
        old = self.table.digest
        self.table = self._agreed_table()
        if self.table.digest != old:
            self.forget(set(self._decisions) | {p.key for p in self._plans.values()})


def group_rank(group: Any) -> tuple[int, int]:
    """``(rank, world size)`` of this process in ``group`` (``(0, 1)`` without torch.distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    if group is not None:
        raise RuntimeError("dispatch: a process group was given but torch.distributed is not initialized")
    return 0, 1
