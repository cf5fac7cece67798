"""Where the benchmark obtains an op and what the op adds to a row: its ``bench`` integration
(:class:`autotaxer.ops._forms.BenchForm`: the parts BSP is made of, the peers). The one place that asks
an op for it."""

from __future__ import annotations

from typing import Any


def op_named(name: str) -> Any:
    """The registered op called ``name``."""
    from ..ops import get_op

    return get_op(name)


def bench_ops() -> list[Any]:
    """The registered ops that have a ``bench`` integration, in registry order."""
    from ..ops import ops_with

    return ops_with("bench")


def bench_form(op: Any) -> Any:
    """The ``bench`` integration of ``op``; ``ValueError`` naming the ops that have one."""
    from ..integrations import form as integration_form

    form = integration_form(op, "bench")
    if form is None:
        names = ", ".join(o.name for o in bench_ops())
        raise ValueError(f"op: bench does not run {op.name} (it runs {names})")
    return form
