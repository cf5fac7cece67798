"""A hash of the kernel sources a tuned record depends on.

The tuner stamps every record with ``kernel_source_hash(op, variant)``; dispatch recomputes it and
reports (or, in strict mode, refuses) records tuned with different sources. The hash covers the
variant's own module and every module of ``autotaxer.kernels`` and of the op's package that it imports,
directly or through others (found by reading the import statements, lazy ones inside functions
included), plus the op's problem module: a change to the push kernel marks push records for re-tuning
and leaves copy-engine records alone. It hashes each module's code as Python parses it, docstrings
left out: reformatting, comments and prose leave the records current; any change to what runs does
not.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imported_modules(module: str, path: Path) -> set[str]:
    """Absolute names of the modules ``module`` (at ``path``) imports, relative imports resolved."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


@lru_cache(maxsize=256)
def _closure(roots: tuple[str, ...], scopes: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    """The modules reachable from ``roots`` through imports that stay inside ``scopes``, sorted."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _origin(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(m for m in _imported_modules(name, path) if m.startswith(scopes) and m not in seen)
    return tuple(sorted(seen.items()))


def _variant_modules(op: str, variant: str) -> tuple[tuple[str, Path], ...]:
    from ..ops import get_op

    the_op = get_op(op)
    if variant not in the_op.variants:
        raise KeyError(f"{op}: no variant {variant!r} in this installation")
    op_module = type(the_op).__module__
    scopes = ("autotaxer.kernels.", f"{op_module.rpartition('.')[0]}.")
    return _closure((type(the_op.variants[variant]).__module__, op_module), scopes)


def kernel_sources(op: str, variant: str) -> list[str]:
    """Names of the modules whose sources :func:`kernel_source_hash` covers."""
    return [name for name, _ in _variant_modules(op, variant)]


def _canonical(node: object) -> str:
    """A node as text: its type and non-empty fields, recursively (no line numbers). Empty fields are
    left out so the text does not change with Python versions that add fields (3.12's ``type_params``)."""
    if isinstance(node, ast.AST):
        fields = (
            f"{name}={_canonical(value)}"
            for name in node._fields
            if (value := getattr(node, name, None)) is not None and value != []
        )
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(_canonical(v) for v in node)}]"
    return repr(node)


def strip_docstrings(tree: ast.AST) -> None:
    """Remove every docstring (module, class, function) from ``tree``, in place (an emptied body gets a
    ``pass``). Imports only the standard library: :mod:`autotaxer.tools._fingerprint` loads this file."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    node.body = node.body[1:] or [ast.Pass()]


def normalized_source(source: str, filename: str = "<source>") -> str:
    """``source``'s code as Python parses it, docstrings (module, class, function) left out: the same for
    two sources that differ only in layout, comments or docstrings."""
    tree = ast.parse(source, filename=filename)
    strip_docstrings(tree)
    return _canonical(tree)


@lru_cache(maxsize=256)
def kernel_source_hash(op: str, variant: str) -> str:
    """sha256 (hex) over the kernel sources ``variant`` of ``op`` uses (module names and
    :func:`normalized_source` of each) and the variant's name.

    Computed once per process (the sources do not change under a running process). ``KeyError`` for a
    variant this installation does not have.
    """
    h = hashlib.sha256()
    for name, path in _variant_modules(op, variant):
        code = normalized_source(path.read_text(encoding="utf-8"), str(path))
        h.update(name.encode() + b"\0" + code.encode() + b"\0")
    h.update(variant.encode())
    return h.hexdigest()
