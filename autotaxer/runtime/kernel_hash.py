"""A hash of the sources a tuned record's launches depend on.

The tuner stamps every record with ``kernel_source_hash(op, variant)``; dispatch recomputes it and
reports (or, in strict mode, refuses) records tuned with different sources. The hash covers the
variant's own module and the op's problem module (where the op class is defined), and every module of
``autotaxer.kernels`` (device code and its launchers) and of ``autotaxer.ops`` (the host code of every
op: its own package and the shared modules, e.g. ``ops/_copy_engine.py``, ``ops/_iris_heap.py``,
``ops/_matmul.py``) that they import, directly or through others (found by reading the import
statements, lazy ones inside functions included). A change to the push kernel or to a host module push
imports marks push records for re-tuning and leaves copy-engine records alone.

Left out, because what a launch computes does not depend on them and covering them would stale every
record on changes that launch nothing new:

- ``autotaxer.ops`` (the registry: a new op would change every record's hash) and each op package's
  ``__init__`` (the op's registration: its variant list and integrations), where an import reaches them;
- the contract: the module(s) defining ``Op``, ``Variant``, ``RunContext`` and ``Workspace``
  (``ops/_base.py``: abstract classes, the variant and integration registries, the tuner's defaults).
  ``RunContext`` hands variants two services that launches do use, and those are covered: a module that
  calls ``ctx.<method>()`` depends on what that method of ``RunContext`` imports (``ctx.iris()``:
  ``ops/_iris_heap.py``; ``ctx.watch_slot()``: ``ops/_peer_wait.py`` and the watch kernel code);
- everything outside ``autotaxer.ops`` and ``autotaxer.kernels``: ``autotaxer._problem`` (keys and
  dtypes), the runtime, the tuner and the integration layer above the ops; the torch, Triton and Iris
  versions are in a record's ``env`` instead.

It hashes each module's code as Python parses it, docstrings left out: reformatting, comments and prose
leave the records current; any change to what runs does not. Only the standard library is imported at
module level: :mod:`autotaxer.tools._fingerprint` loads this file to apply the same rules to an older
tree (:func:`covered_modules`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

#: Packages whose modules the hash follows imports into.
SCOPES = ("autotaxer.kernels.", "autotaxer.ops.")
#: The registry (module docstring): never followed through an import.
REGISTRY = "autotaxer.ops"
#: What the registry exports of the contract: the modules defining them are never followed either.
CONTRACT = ("Op", "Variant", "RunContext", "Workspace")


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imports_in(node: ast.AST, package: str) -> set[str]:
    """Absolute names of the modules the import statements under ``node`` name (relative ones resolved
    against ``package``); ``from pkg import name`` gives both ``pkg`` and ``pkg.name``."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import):
            found.update(alias.name for alias in sub.names)
        elif isinstance(sub, ast.ImportFrom):
            if sub.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - sub.level + 1])
                base = f"{base}.{sub.module}" if sub.module else base
            else:
                base = sub.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in sub.names)  # `from pkg import module`
    return found


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported_modules(module: str, path: Path) -> set[str]:
    """Absolute names of the modules ``module`` (at ``path``) imports, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _imports_in(tree, _package(module, path))


def _contract() -> tuple[frozenset[str], type | None]:
    """The modules defining the contract's classes (:data:`CONTRACT`, as the registry exports them) and
    ``RunContext``; imports the tree's registry (``autotaxer.ops``), wherever its classes live."""
    import importlib

    registry = importlib.import_module(REGISTRY)
    classes = [getattr(registry, name, None) for name in CONTRACT]
    return frozenset(c.__module__ for c in classes if c is not None), getattr(registry, "RunContext", None)


@lru_cache(maxsize=1)
def _services() -> dict[str, frozenset[str]]:
    """``RunContext``'s methods -> the modules each imports: what a variant calling ``ctx.<method>()``
    depends on."""
    context = _contract()[1]
    path = _origin(context.__module__) if context is not None else None
    if path is None:
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package(context.__module__, path)
    found: dict[str, frozenset[str]] = {}
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == context.__name__:
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not fn.name.startswith("__"):
                    found[fn.name] = frozenset(_imports_in(fn, package))
    return found


def _reached(module: str, path: Path, services: dict[str, frozenset[str]]) -> set[str]:
    """What ``module`` (at ``path``) imports, and the modules behind every ``x.<method>(...)`` call in it
    whose method is a service (one walk of the tree)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package(module, path)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                found |= services.get(node.func.attr, frozenset())
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= _imports_in(node, package)
    return found


def _left_out(module: str, path: Path, contract: frozenset[str]) -> bool:
    """The registry, an op package's ``__init__`` (its registration) and the contract's modules."""
    if module == REGISTRY or module in contract:
        return True
    op_package = module.startswith(REGISTRY + ".") and module.count(".") == REGISTRY.count(".") + 1
    return op_package and path.name == "__init__.py"


@lru_cache(maxsize=256)
def covered_modules(roots: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    """The modules the hash covers for a variant whose module and op module are ``roots``: the roots
    and what they reach through imports and ``RunContext`` services inside :data:`SCOPES`, left-out
    modules not followed (module docstring), sorted by name."""
    contract, services = _contract()[0], _services()
    seen: dict[str, Path] = {}
    looked: set[str] = set()  # every name looked up (a module, a name inside one, a left-out module)
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in looked:
            continue
        looked.add(name)
        path = _origin(name)
        if path is None or (name not in roots and _left_out(name, path, contract)):
            continue
        seen[name] = path
        todo.extend(m for m in _reached(name, path, services) if m.startswith(SCOPES) and m not in looked)
    return tuple(sorted(seen.items()))


def _variant_modules(op: str, variant: str) -> tuple[tuple[str, Path], ...]:
    from ..ops import get_op

    the_op = get_op(op)
    if variant not in the_op.variants:
        raise KeyError(f"{op}: no variant {variant!r} in this installation")
    return covered_modules((type(the_op.variants[variant]).__module__, type(the_op).__module__))


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


@lru_cache(maxsize=512)
def _module_code(path: Path) -> str:
    """:func:`normalized_source` of the file at ``path``, once per process (modules several variants
    cover are read once)."""
    return normalized_source(path.read_text(encoding="utf-8"), str(path))


@lru_cache(maxsize=256)
def kernel_source_hash(op: str, variant: str) -> str:
    """sha256 (hex) over the kernel sources ``variant`` of ``op`` uses (module names and
    :func:`normalized_source` of each) and the variant's name.

    Computed once per process (the sources do not change under a running process). ``KeyError`` for a
    variant this installation does not have.
    """
    h = hashlib.sha256()
    for name, path in _variant_modules(op, variant):
        h.update(name.encode() + b"\0" + _module_code(path).encode() + b"\0")
    h.update(variant.encode())
    return h.hexdigest()
