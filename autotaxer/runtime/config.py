"""A runtime's settings: :class:`RuntimeConfig`, a frozen dataclass whose ``validate()`` names the bad field.

Where the table comes from is declared by its base class (:class:`~autotaxer.runtime.table.TableSources`);
the rest bounds the plan cache, the waits on peers and the exchanges between ranks, and says whether
misses are persisted or tuned at their first call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from .agreement import AGREE_TIMEOUT_S
from .table import TableSources

#: the longest bound of a wait on peers that a config accepts, in seconds (kernels count it in int64 ns)
MAX_WAIT_S = 86400.0


@dataclass(frozen=True)
class RuntimeConfig(TableSources):
    """Settings of a runtime; defaults suit most users. Where the table comes from (``tables``,
    ``db_url``, ``env_tables``, ``shipped_tables``, ``strict``, ``timing``) is declared by the base class,
    :class:`~autotaxer.runtime.table.TableSources`.

    ``tables``: extra table files or folders, highest precedence (then ``$AUTOTAXER_TABLE`` when
    ``env_tables``, then ``db_url``, then the shipped ``tuning_db/`` when ``shipped_tables``).
    ``strict``: refuse records tuned with other kernel sources or torch/triton/iris versions.
    ``timing``: ``"graph"`` serves only winners tuned with ``autotaxer tune --timing graph`` (BSP for the
    rest), for code that runs dispatch inside CUDA graphs, where BSP's launch costs vanish and an eager
    winner can lose; ``"eager"`` only eager-tuned ones; None (default) any record.
    ``max_m_ratio``: nearest-M lookup accepts a tuned M within this factor of the requested M.
    ``min_nearest_speedup``: ... and only a winner that beat BSP there at least by this factor.
    ``workspace_cache``: most (shape, variant, params) workspaces kept (least recently used dropped).
    ``misses_path``: where rank 0 appends misses at shutdown (None: ``$AUTOTAXER_MISSES`` or the default
    file); ``persist_misses=False`` keeps them in memory only.
    ``peer_timeout_s``: how long a kernel's wait on a peer may spin before it gives up and dispatch raises
    ``PeerTimeoutError`` (None: ``$AUTOTAXER_PEER_TIMEOUT``, else 5 s); ``first_call_timeout_s``: the
    bound of a workspace's first call, while ranks may still be compiling (at least ``peer_timeout_s``).
    ``agree_timeout_s``: how long a signature's first call waits for every rank to come to its exchange
    before it raises ``OutOfStepError`` (a peer that never comes called differently and waits elsewhere).
    ``check_calls``: before every call, exchange its signature (op, shapes, strides, dtypes, layout,
    ``requires_grad``) with every rank and raise on all of them when they differ: a collective per call,
    for debugging (without it only a signature's first call is compared).
    ``symm_mem``: the backend torch's symmetric memory runs in this process, one a process: ``"cuda"``
    (torch's fused ops and PyTorch's async TP; the default) or ``"nccl"`` (NCCL's symmetric BSP forms);
    None keeps ``$AUTOTAXER_SYMM_MEM``.
    ``tune_misses``: seconds a key with no tuned record may be tuned at its first call, every rank of the
    group taking part (:mod:`autotaxer.tuner.in_group`), before that call is served its winner; None
    (default): never. A key ``torch.compile`` first meets while tracing is not (``autotaxer.warmup`` is).
    ``tune_misses_total_s``: the most seconds this runtime spends so. Trials and winners go to ``db_url``
    (default: the default database, which is then also a table source).
    """

    heap_size: int = 1 << 30
    max_m_ratio: float = 2.0
    min_nearest_speedup: float = 1.1
    workspace_cache: int = 64
    misses_path: str | None = None
    persist_misses: bool = True
    peer_timeout_s: float | None = None
    first_call_timeout_s: float = 30.0
    check_calls: bool = False
    agree_timeout_s: float = AGREE_TIMEOUT_S
    symm_mem: str | None = None
    tune_misses: float | None = None
    tune_misses_total_s: float = 600.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value is unusable."""
        from ..ops._symm_backend import CHOICES

        if self.symm_mem is not None and self.symm_mem not in CHOICES:
            raise ValueError(f"symm_mem: expected one of {', '.join(CHOICES)}, got {self.symm_mem!r}")
        if self.heap_size <= 0:
            raise ValueError(f"heap_size: must be positive, got {self.heap_size}")
        if not (self.max_m_ratio >= 1.0 and math.isfinite(self.max_m_ratio)):
            raise ValueError(f"max_m_ratio: must be a finite number >= 1, got {self.max_m_ratio}")
        if not (self.min_nearest_speedup > 0 and math.isfinite(self.min_nearest_speedup)):
            raise ValueError(
                f"min_nearest_speedup: must be a finite number > 0, got {self.min_nearest_speedup}"
            )
        if self.workspace_cache < 1:
            raise ValueError(f"workspace_cache: must be at least 1, got {self.workspace_cache}")
        for name in (
            "peer_timeout_s", "first_call_timeout_s", "agree_timeout_s", "tune_misses", "tune_misses_total_s"
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"{name}: must be a finite number of seconds > 0, got {value!r}")
        for name, value in (
            ("peer_timeout_s", self.peer_timeout()),
            ("first_call_timeout_s", self.first_call_timeout_s),
            ("agree_timeout_s", self.agree_timeout_s),
        ):
            if value > MAX_WAIT_S:  # kernels count the bound in int64 nanoseconds, the store in a timedelta
                where = (
                    "$AUTOTAXER_PEER_TIMEOUT"
                    if name == "peer_timeout_s" and self.peer_timeout_s is None
                    else name
                )
                raise ValueError(f"{where}: at most {MAX_WAIT_S:.0f} seconds (one day), got {value!r}")
        sources = self.table_sources()
        sources.validate()
        for path in sources.tables:  # refused at init, not at the first call
            if not Path(path).expanduser().exists():
                raise ValueError(f"tables: {path}: no such table file or folder")

    def peer_timeout(self) -> float:
        """The bound of kernels' waits on peers, in seconds (``peer_timeout_s``, else the environment's)."""
        from autotaxer.kernels.common.watch import timeout_from_env

        return float(self.peer_timeout_s) if self.peer_timeout_s is not None else timeout_from_env()

    def tuning_db_url(self) -> str:
        """The database that tuning in the model's own processes writes (``db_url``, else the default)."""
        from ..storage import default_url

        return self.db_url or default_url()

    def table_sources(self) -> TableSources:
        """This config's table settings, ``tables`` as strings; with ``tune_misses`` the tuning database is
        a source (the winners tuned at first calls are served from it)."""
        own = {f.name: getattr(self, f.name) for f in fields(TableSources)}
        if not isinstance(self.tables, str):  # a single string is refused by validate(), by name
            own["tables"] = tuple(str(p) for p in self.tables)
        own["db_url"] = self.tuning_db_url() if self.tune_misses is not None else self.db_url
        return TableSources(**own)
