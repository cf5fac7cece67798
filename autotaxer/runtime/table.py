"""The runtime table: tuned winners merged from several sources, loaded once per runtime.

Sources, highest precedence first (a key found in a higher source hides every lower record of it):

1. explicit paths given to the runtime (``TableSources.tables``; earlier paths win);
2. ``$AUTOTAXER_TABLE`` (``env_tables``): ``os.pathsep``-separated files or folders (earlier entries win);
3. a tuning database URL (``TableSources.db_url``; SQLAlchemy is imported only then);
4. the shipped defaults (``shipped_tables``), ``tuning_db/*.json`` (package data ``autotaxer.tuning_db``
   in a wheel, the repository's ``tuning_db/`` folder in an editable install).

A folder given as a path means every ``*.json`` and ``*.csv`` table in it. Within one source, duplicate
keys keep the faster record timed the same way (of an eager and a graph-timed record, the eager one).
Records measured on another device type (``cpu`` vs ``cuda``) are dropped, and so are records timed in
another mode than ``TableSources.timing`` asks for (eager back-to-back or CUDA-graph replay; None: any).
A record whose kernel hash or torch/triton/iris version differs from this process is *stale*: reported
(warning once per load, listed by :func:`stale_report`) and kept, or refused in strict mode (a lower
source may then serve its key).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._problem import ProblemKey, Target
from ..records import timing_of

#: Environment variable with extra table files (``os.pathsep``-separated).
TABLE_ENV = "AUTOTAXER_TABLE"
#: Software versions compared between a record and this process.
VERSION_FIELDS = ("torch", "triton", "iris")
#: How a record's times were measured (``env["timing"]``; unstamped records are eager), None = any.
TIMINGS = (None, "eager", "graph")


@dataclass(frozen=True)
class TableSources:
    """Where the runtime table comes from (see the module docstring for precedence); the first settings
    of :class:`autotaxer.RuntimeConfig`, which names them the same."""

    tables: tuple[str, ...] = ()
    db_url: str | None = None
    env_tables: bool = True
    shipped_tables: bool = True
    strict: bool = False
    timing: str | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value is unusable."""
        if self.timing not in TIMINGS:
            raise ValueError(f"timing: expected one of eager, graph or None (any), got {self.timing!r}")
        if isinstance(self.tables, str):
            raise ValueError("tables: expected a tuple of paths, got a single string")
        for p in self.tables:
            if not str(p):
                raise ValueError("tables: empty path")


@dataclass(frozen=True)
class Staleness:
    """A record tuned in another environment: which record, from where, and why."""

    key: ProblemKey
    variant: str
    origin: str
    reasons: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{self.key.text} ({self.variant}, from {self.origin}): {'; '.join(self.reasons)}"


@dataclass
class Table:
    """Merged winners by problem key, where each came from, and the stale records seen."""

    records: dict[ProblemKey, Any] = field(default_factory=dict)
    origins: dict[ProblemKey, str] = field(default_factory=dict)
    stale: tuple[Staleness, ...] = ()
    refused: tuple[Staleness, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 over what decisions depend on (key, variant, params): equal tables, equal digests."""
        return table_digest(self.records.values())


def table_digest(records: Iterable[Any]) -> str:
    """Order-independent digest of ``(key, variant, params)`` of ``records``."""
    rows = sorted(
        json.dumps([r.key.text, r.variant, dict(r.params)], sort_keys=True, default=str) for r in records
    )
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


# -- locating sources -------------------------------------------------------------------------------
def shipped_table_dir() -> Path | None:
    """The folder of shipped tables: package data in a wheel, ``<repo>/tuning_db`` in an editable install."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("autotaxer.tuning_db")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if Path(loc).is_dir():
                return Path(loc)
    repo = Path(__file__).resolve().parents[2]
    candidate = repo / "tuning_db"
    if candidate.is_dir() and (repo / "pyproject.toml").is_file() and (repo / "autotaxer").is_dir():
        return candidate
    return None


def _expand(path: str | os.PathLike) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_dir():
        return sorted([*p.glob("*.json"), *p.glob("*.csv")])
    if not p.exists():
        raise FileNotFoundError(f"{p}: table file not found")
    return [p]


def env_table_paths(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Entries of ``$AUTOTAXER_TABLE`` (empty entries ignored)."""
    value = (os.environ if environ is None else environ).get(TABLE_ENV, "")
    return tuple(p for p in value.split(os.pathsep) if p)


def _read_files(paths: Iterable[Path]) -> list[Any]:
    from ..table_file import read_table

    out: list[Any] = []
    for p in paths:
        out.extend(read_table(p))
    return out


def _read_database(url: str) -> list[Any]:
    from ..storage import MissingDatabase, open_database

    try:
        db = open_database(url, read_only=True)
    except MissingDatabase:  # nothing tuned there yet: no records (nothing is created)
        return []
    try:
        if db.current_revision() is None:  # another process is creating it right now: nothing tuned yet
            return []
        return list(db.winners())
    finally:
        db.close()


def _sources(cfg: TableSources, environ: Mapping[str, str] | None) -> list[tuple[str, list[Any]]]:
    """``(label, records)`` per source, highest precedence first."""
    out: list[tuple[str, list[Any]]] = []
    for p in cfg.tables:
        out.append((str(p), _read_files(_expand(p))))
    if cfg.env_tables:
        for p in env_table_paths(environ):
            out.append((f"${TABLE_ENV}:{p}", _read_files(_expand(p))))
    if cfg.db_url is not None:
        out.append((cfg.db_url, _read_database(cfg.db_url)))
    if cfg.shipped_tables:
        shipped = shipped_table_dir()
        if shipped is not None:
            out.append((f"shipped:{shipped}", _read_files(sorted(shipped.glob("*.json")))))
    return out


# -- staleness --------------------------------------------------------------------------------------
def current_environment() -> dict[str, str | None]:
    """This process's software versions (``autotaxer._target.software_versions``)."""
    from .._target import software_versions

    return software_versions()


def stale_reasons(record: Any, env: Mapping[str, str | None]) -> tuple[str, ...]:
    """Why ``record`` was tuned in a different environment than ``env`` (empty when it was not)."""
    from .kernel_hash import kernel_source_hash

    reasons = []
    if record.kernel_hash:
        try:
            now = kernel_source_hash(record.key.op, record.variant)
        except KeyError:  # a variant (or op) this installation does not have: the record cannot run here
            now = "missing"
        if record.kernel_hash != now:
            reasons.append(f"kernel sources changed (tuned {record.kernel_hash[:12]}, now {now[:12]})")
    rec_env = record.env or {}
    for name in VERSION_FIELDS:
        then, now_v = rec_env.get(name), env.get(name)
        if then and now_v and then != now_v:
            reasons.append(f"{name} {then} -> {now_v}")
    return tuple(reasons)


def stale_report(
    records: Iterable[Any], env: Mapping[str, str | None] | None = None, origin: str = ""
) -> list[Staleness]:
    """The stale records among ``records`` (for ``autotaxer show``)."""
    env = current_environment() if env is None else env
    out = []
    for rec in records:
        reasons = stale_reasons(rec, env)
        if reasons:
            out.append(Staleness(rec.key, rec.variant, origin, reasons))
    return out


# -- loading ----------------------------------------------------------------------------------------
def merge(
    sources: Iterable[tuple[str, Iterable[Any]]],
    target: Target,
    env: Mapping[str, str | None],
    strict: bool = False,
    timing: str | None = None,
) -> Table:
    """Merge ``(label, records)`` sources given highest precedence first into one :class:`Table`.

    ``timing`` (``eager``/``graph``): only records measured that way count; the others are skipped as if
    absent (a CUDA-graph deployment then never runs a winner that only won eager)."""
    table = Table()
    stale: list[Staleness] = []
    refused: list[Staleness] = []
    labels = []
    for label, records in sources:
        labels.append(label)
        best: dict[ProblemKey, Any] = {}
        for rec in records:
            if rec.device_type != target.device_type:
                continue
            if timing is not None and timing_of(rec.env) != timing:
                continue
            reasons = stale_reasons(rec, env)
            if reasons:
                item = Staleness(rec.key, rec.variant, label, reasons)
                if strict:
                    refused.append(item)
                    continue
                stale.append(item)
            old = best.get(rec.key)
            if old is None:
                best[rec.key] = rec
            elif timing_of(rec.env) != timing_of(old.env):  # medians of two modes do not compare:
                if timing_of(rec.env) == "eager":  # with no mode asked for, serve the eager one
                    best[rec.key] = rec
            elif rec.median_us < old.median_us:
                best[rec.key] = rec
        for key, rec in best.items():
            if key not in table.records:
                table.records[key] = rec
                table.origins[key] = label
    table.stale = tuple(s for s in stale if table.origins.get(s.key) == s.origin)
    table.refused = tuple(refused)
    table.sources = tuple(labels)
    return table


def load_table(
    cfg: TableSources,
    target: Target,
    env: Mapping[str, str | None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Table:
    """Read every source of ``cfg`` and merge them for ``target``; warns once about stale records.

    Raises ``TableFileError``/``FileNotFoundError``/``DatabaseError`` for a source that cannot be read.
    """
    cfg.validate()
    env = current_environment() if env is None else env
    table = merge(_sources(cfg, environ), target, env, cfg.strict, cfg.timing)
    if table.stale:
        warnings.warn(
            f"autotaxer: {len(table.stale)} table record(s) were tuned with other kernel sources or "
            f"software versions (first: {table.stale[0].text}); `autotaxer show` lists them, strict mode "
            "refuses them",
            RuntimeWarning,
            stacklevel=2,
        )
    if table.refused:
        warnings.warn(
            f"autotaxer: strict mode refused {len(table.refused)} stale table record(s) "
            f"(first: {table.refused[0].text})",
            RuntimeWarning,
            stacklevel=2,
        )
    return table
