"""Drop-in functions with PyTorch's signatures, served by :func:`autotaxer.dispatch`.

Each comes from the op that serves it (its ``functions`` integration, in :mod:`autotaxer.integrations`),
found in the op registry on first use: ``fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name)``
and ``fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)`` have the contracts of
``torch.ops.symm_mem``'s ops of those names.
"""

from __future__ import annotations

from typing import Any


def function_names() -> list[str]:
    """The functions the registered ops provide here."""
    from .ops import ops_with

    return sorted(name for op in ops_with("functions") for name in op.function_names)


def __getattr__(name: str) -> Any:
    from .integrations import form
    from .ops import ops_with

    for op in ops_with("functions"):
        if name in op.function_names:
            value = form(op, "functions")[name]
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *function_names()})
