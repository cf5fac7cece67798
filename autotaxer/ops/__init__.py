"""Registry of tunable ops: one line an op in :data:`REGISTRY`.

An op is its two folders, ``autotaxer/ops/<op>/`` (host side: the problem, variants, search space and
what integrations it takes part in, see :mod:`._forms`) and ``kernels/<op>/`` (device code), plus its
registry line. The runtime, the commands, the benchmark, the tuner, the integrations and the layers find
every op here and name none. ``get_op("ag_gemm")`` returns the op with all its variants registered.

Ops outside this package register in ``$AUTOTAXER_OPS`` (``name=package[,name=package...]``, each
package exposing ``OP``), which every spawned rank and worker inherits, or in one process with
:func:`register_op`. Variants outside an op's package (the tests' planted faults) register in
``$AUTOTAXER_VARIANTS`` (``op=module[,...]``, each module exposing ``VARIANTS``), inherited likewise.
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
#: Extra variants of registered ops, ``op=module`` entries separated by commas (the tests' planted faults).
VARIANTS_ENV_VAR = "AUTOTAXER_VARIANTS"

_OPS: dict[str, Op] = {}


def _env_entries(var: str, what: str) -> list[tuple[str, str]]:
    """The ``name=value`` entries of ``$var`` (``ValueError`` naming a malformed entry)."""
    entries = []
    for entry in filter(None, (e.strip() for e in os.environ.get(var, "").split(","))):
        name, sep, value = (part.strip() for part in entry.partition("="))
        if not (sep and name and value):
            raise ValueError(f"${var}: entry {entry!r} is not {what}")
        entries.append((name, value))
    return entries


def _entries() -> dict[str, str]:
    """The registry's lines and those of ``$AUTOTAXER_OPS`` (``ValueError`` naming a malformed entry)."""
    return {**REGISTRY, **dict(_env_entries(ENV_VAR, "name=package"))}


def _load() -> None:
    if _OPS:
        return
    for name, package in _entries().items():
        op = importlib.import_module(package).OP
        if op.name != name:
            raise ValueError(f"{package}: its OP is named {op.name!r}, registered as {name!r}")
        _OPS[name] = op
    for name, module in _env_entries(VARIANTS_ENV_VAR, "op=module"):
        if name not in _OPS:
            known = ", ".join(_OPS)
            raise ValueError(f"${VARIANTS_ENV_VAR}: {name!r} is not a registered op (known: {known})")
        for variant in importlib.import_module(module).VARIANTS:
            _OPS[name].register(variant)


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


def variant_names() -> list[str]:
    """Names of every registered op's variants (what ``--variants`` may name), sorted."""
    _load()
    return sorted({v for op in _OPS.values() for v in op.variants})


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
    "variant_names",
    "iter_grid",
    "layer_op",
    "op_names",
    "ops_with",
    "register_op",
    "relative_error",
]
