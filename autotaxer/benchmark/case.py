"""What a benchmark run measures: its cases (an op's shape, layout and dtype) and its plan
(:class:`BenchConfig`), each validated by a ``validate()`` that names the bad field."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._problem import DTYPES, ProblemKey
from .form import bench_form, bench_ops, op_named

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Case:
    """One benchmarked problem: the op, its shape and layout fields (as a shapes file names them) and
    the dtype; :meth:`of` builds one from field values."""

    op: str
    shape: tuple[tuple[str, int], ...]
    layout: tuple[tuple[str, Any], ...] = ()
    dtype: str = "bf16"

    @classmethod
    def of(cls, op: str, dtype: str = "bf16", **fields: Any) -> Case:
        """The case of ``op`` with these shape and layout fields (unnamed layout fields: their defaults);
        ``ValueError`` naming a field the op does not have or a missing shape field."""
        opobj = op_named(op)
        unknown = [f for f in fields if f not in opobj.shape_fields and f not in opobj.layout_choices]
        if unknown:
            raise ValueError(f"{unknown[0]}: not a field of op {op!r}")
        missing = [f for f in opobj.shape_fields if f not in fields]
        if missing:
            raise ValueError(f"{missing[0]}: missing (op {op!r} needs {','.join(opobj.shape_fields)})")
        layout = {**opobj.layout_defaults(), **{f: v for f, v in fields.items() if f in opobj.layout_choices}}
        return cls(op, tuple((f, fields[f]) for f in opobj.shape_fields), tuple(layout.items()), dtype)

    def key(self, gpu_model: str, world_size: int) -> ProblemKey:
        """The problem key of this case on ``gpu_model`` with ``world_size`` ranks."""
        shape, layout = dict(self.shape), dict(self.layout)
        return ProblemKey.make(self.op, gpu_model, world_size, self.dtype, shape, layout)

    def row(self) -> dict[str, Any]:
        """The fields a result row starts with: ``op``, the shape and layout fields, ``dtype``."""
        return {"op": self.op, **dict(self.shape), **dict(self.layout), "dtype": self.dtype}

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r} (expected one of {', '.join(DTYPES)})")
        opobj = op_named(self.op)
        bench_form(opobj)
        for f, v in self.shape:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{f}: must be a positive integer, got {v!r}")
        for f, v in self.layout:
            choices = opobj.layout_choices.get(f)
            if choices is None or v not in choices:
                allowed = ", ".join(str(c) for c in choices or ())
                raise ValueError(f"{f}: must be one of {allowed}, got {v!r}")


@dataclass(frozen=True)
class BenchConfig:
    """What to run; frozen so every rank gets the same plan.

    ``variants``: None = every available non-baseline variant of the tuner's default space. ``max_configs``:
    configurations swept per variant that has no tuned configuration. ``db_url``/``tables``: where tuned
    configurations and dispatch's table come from (None/empty: dispatch's defaults); ``dispatch_timing``
    is dispatch's ``RuntimeConfig.timing`` (only winners tuned that way). ``progress_path``:
    rank 0 appends each finished row there as one JSON line, so a run cut short keeps what it measured.
    ``chain``: ``dependent`` (each call waits for the previous one's output) or ``back-to-back``.
    """

    def link(self, feeds: Any, out: Any = None) -> Any:
        """The :class:`autotaxer.measure.Chain` of an entry reading ``feeds`` (None: back to back)."""
        from ..measure import Chain

        return Chain(feeds, out) if self.chain == "dependent" else None

    cases: tuple[Case, ...]
    world_size: int = 2
    device: str = "cuda"
    variants: tuple[str, ...] | None = None
    max_configs: int = 8
    warmup: int = 5
    iters: int = 20
    samples: int = 9
    peers: bool = True
    dispatch: bool = True
    db_url: str | None = None
    tables: tuple[str, ...] = ()
    heap_gib: int = 8
    peer_timeout: float = 180.0
    seed: int = 1234
    progress_path: str | None = None
    dispatch_timing: str | None = None
    chain: str = "dependent"

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field."""
        from ..measure import CHAINS

        if not self.cases:
            raise ValueError("cases: nothing to benchmark")
        if self.chain not in CHAINS:
            raise ValueError(f"chain: expected one of {', '.join(CHAINS)}, got {self.chain!r}")
        if self.world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {self.world_size}")
        if self.device not in DEVICES:
            raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        for name, low in (("max_configs", 1), ("warmup", 0), ("iters", 1), ("samples", 1), ("heap_gib", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: must be >= {low}, got {getattr(self, name)}")
        if not self.peer_timeout > 0:
            raise ValueError(f"peer_timeout: must be > 0 seconds, got {self.peer_timeout}")
        if self.dispatch_timing not in (None, "eager", "graph"):
            raise ValueError(f"dispatch_timing: expected eager, graph or None, got {self.dispatch_timing!r}")
        for c in self.cases:
            c.validate()

    @property
    def modes(self) -> tuple[str, ...]:
        """Timing modes: eager and CUDA graph on GPUs, eager only on CPU."""
        return ("eager", "graph") if self.device == "cuda" else ("eager",)


def cases_from_shapes(rows: Iterable[Any]) -> tuple[Case, ...]:
    """Cases of the rows of a shapes file (:class:`autotaxer.shapes.ShapeRow`) whose op ``bench`` runs
    (its ``bench`` integration); the others are left out."""
    names = {op.name for op in bench_ops()}
    return tuple(Case.of(r.op, r.dtype, **r.shape, **r.layout) for r in rows if r.op in names)


def case_text(case: Case) -> str:
    """``ag_gemm M=64 N=256 K=256 gather_dim=0 b_layout=kn fp32``: a case in one short line."""
    fields = " ".join(f"{f}={v}" for f, v in (*case.shape, *case.layout))
    return f"{case.op} {fields} {case.dtype}"
