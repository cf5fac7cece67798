"""A hash of the kernel sources a tuned record depends on.

The tuner stamps every record with ``kernel_source_hash(op, variant)``; dispatch recomputes it and
reports (or, in strict mode, refuses) records tuned with different sources. The hash covers every
``.py`` file of ``autotaxer/kernels`` and ``autotaxer/ops/<op>`` (path and bytes, sorted by path) plus
the variant name: coarse on purpose, so any kernel change marks the records for re-tuning.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path


def _package_dirs(name: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=64)
def _tree_digest(package: str) -> str:
    h = hashlib.sha256()
    for root in _package_dirs(package):
        for path in _source_files(root):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def kernel_source_hash(op: str, variant: str) -> str:
    """sha256 (hex) over the sources of ``autotaxer/kernels`` and ``autotaxer/ops/<op>``, and ``variant``.

    Computed once per process and package (the sources do not change under a running process).
    """
    h = hashlib.sha256()
    for package in ("autotaxer.kernels", f"autotaxer.ops.{op}"):
        h.update(package.encode())
        h.update(_tree_digest(package).encode())
    h.update(variant.encode())
    return h.hexdigest()
