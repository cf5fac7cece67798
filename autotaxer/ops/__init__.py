"""Registry of tunable ops: one line an op in :data:`REGISTRY`.

An op is its two folders, ``autotaxer/ops/<op>/`` (host side: the problem, variants, search space and its
integrations, see :mod:`._forms`) and ``kernels/<op>/`` (device code), plus its registry line. The
runtime, the commands, the benchmark, the tuner and the layers find every op here and name none.
``get_op("ag_gemm")`` returns the op with all its variants registered.

Ops outside this package register in ``$AUTOTAXER_OPS`` (``name=package[,name=package...]``, each
package exposing ``OP``), which every spawned rank and worker inherits, or in one process with
:func:`register_op`.
"""

from __future__ import annotations

import importlib
import os

from ._base import Op, Params, RunContext, Variant, Workspace, iter_grid, relative_error

#: Op name -> the package exposing it as ``OP``. The first is the default op of shapes files and commands.
REGISTRY: dict[str, str] = {
    "ag_gemm": "autotaxer.ops.ag_gemm",
    "gemm_rs": "autotaxer.ops.gemm_rs",
    "flash_decode": "autotaxer.ops.flash_decode",
}
DEFAULT_OP = next(iter(REGISTRY))
#: Extra ops, ``name=package`` entries separated by commas (plugins, the tests' planted op).
ENV_VAR = "AUTOTAXER_OPS"

_OPS: dict[str, Op] = {}


def _entries() -> dict[str, str]:
    """The registry's lines and those of ``$AUTOTAXER_OPS`` (``ValueError`` naming a malformed entry)."""
    lines = dict(REGISTRY)
    for entry in filter(None, (e.strip() for e in os.environ.get(ENV_VAR, "").split(","))):
        name, sep, package = (part.strip() for part in entry.partition("="))
        if not (sep and name and package):
            raise ValueError(f"${ENV_VAR}: entry {entry!r} is not name=package")
        lines[name] = package
    return lines


def _load() -> None:
    if _OPS:
        return
    for name, package in _entries().items():
        op = importlib.import_module(package).OP
        if op.name != name:
            raise ValueError(f"{package}: its OP is named {op.name!r}, registered as {name!r}")
        _OPS[name] = op


def get_op(name: str) -> Op:
    """The registered op called ``name``; ``KeyError`` with the known names otherwise."""
    _load()
    if name not in _OPS:
        raise KeyError(f"unknown op {name!r} (known: {', '.join(sorted(_OPS))})")
    return _OPS[name]


def op_names() -> list[str]:
    """Names of all registered ops."""
    _load()
    return sorted(_OPS)


def ops_with(kind: str) -> list[Op]:
    """The registered ops that take part in integration ``kind`` (e.g. ``"bench"``), in registry order."""
    _load()
    return [op for op in _OPS.values() if kind in op.integrations]


def layer_op(role: str) -> Op:
    """The first registered op that serves the tensor-parallel layer ``role`` (``column``/``row``)."""
    _load()
    for op in _OPS.values():
        if op.layer is not None and op.layer.role == role:
            return op
    raise LookupError(f"no registered op serves the {role!r} layer")


def register_op(op: Op) -> Op:
    """Register an additional op in this process (plugins, tests)."""
    _load()
    _OPS[op.name] = op
    return op


__all__ = [
    "DEFAULT_OP",
    "REGISTRY",
    "Op",
    "Params",
    "RunContext",
    "Variant",
    "Workspace",
    "get_op",
    "iter_grid",
    "layer_op",
    "op_names",
    "ops_with",
    "register_op",
    "relative_error",
]
