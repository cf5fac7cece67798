"""Registry of tunable ops. ``get_op("ag_gemm")`` returns the op with all its variants registered."""

from __future__ import annotations

import importlib
import importlib.util

from ._base import Op, Params, RunContext, Variant, Workspace, iter_grid, relative_error

_OPS: dict[str, Op] = {}


_BUILTIN = ("ag_gemm", "gemm_rs", "flash_decode")  # packages under autotaxer/ops exposing OP


def _load_builtin() -> None:
    if _OPS:
        return
    for name in _BUILTIN:
        qual = f"{__name__}.{name}"
        if importlib.util.find_spec(qual) is not None:
            op = importlib.import_module(qual).OP
            _OPS[op.name] = op


def get_op(name: str) -> Op:
    """The registered op called ``name``; ``KeyError`` with the known names otherwise."""
    _load_builtin()
    if name not in _OPS:
        raise KeyError(f"unknown op {name!r} (known: {', '.join(sorted(_OPS))})")
    return _OPS[name]


def op_names() -> list[str]:
    """Names of all registered ops."""
    _load_builtin()
    return sorted(_OPS)


def register_op(op: Op) -> Op:
    """Register an additional op (plugins, tests)."""
    _load_builtin()
    _OPS[op.name] = op
    return op


__all__ = [
    "Op",
    "Params",
    "RunContext",
    "Variant",
    "Workspace",
    "get_op",
    "iter_grid",
    "op_names",
    "register_op",
    "relative_error",
]
