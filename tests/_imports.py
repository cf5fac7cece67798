"""Reading a module's imports from its source: every ``import`` and ``from ... import`` anywhere in the
file (lazy ones inside functions included), relative ones resolved against the module's package."""

from __future__ import annotations

import ast
from pathlib import Path


def imported(path: Path, package: str) -> set[str]:
    """Absolute names of everything ``path`` imports, anywhere in its code, relative imports resolved
    against ``package`` (the package its relative imports start in); ``from a import b`` gives ``a`` and
    ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1]) + (f".{base}" if base else "")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found
