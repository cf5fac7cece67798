"""The op is the unit: ``kernels/<op>/`` and ``autotaxer/ops/<op>/`` import no other op's code, and
``kernels/common/`` (device code several ops share) imports no op at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotaxer.runtime.kernel_hash import _imported_modules

ROOT = Path(__file__).resolve().parents[2]
OPS = ("ag_gemm", "gemm_rs", "flash_decode")


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules ``path`` (a module of ``package``) imports, relative ones resolved
    (the reading the kernel hash does)."""
    module = package if path.name == "__init__.py" else f"{package}.{path.stem}"
    return _imported_modules(module, path)


def _modules(folder: Path, package: str):
    for path in sorted(folder.rglob("*.py")):
        sub = path.relative_to(folder).parts
        yield path, ".".join((package, *sub[:-1]))  # the package a module (or __init__) belongs to


def _names_op(name: str, op: str) -> bool:
    return name.startswith((f"autotaxer.kernels.{op}", f"autotaxer.ops.{op}"))


@pytest.mark.parametrize("op", OPS)
def test_an_ops_code_imports_no_other_op(op: str) -> None:
    others = [o for o in OPS if o != op]
    bad = []
    for folder, package in ((ROOT / "kernels" / op, f"autotaxer.kernels.{op}"),
                            (ROOT / "autotaxer" / "ops" / op, f"autotaxer.ops.{op}")):  # fmt: skip
        for path, pkg in _modules(folder, package):
            bad += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in _imports(path, pkg)
                for o in others
                if _names_op(n, o)
            ]
    assert not bad, "\n".join(bad)


def test_shared_device_code_depends_on_no_op() -> None:
    bad = []
    for path, pkg in _modules(ROOT / "kernels" / "common", "autotaxer.kernels.common"):
        bad += [
            f"{path.relative_to(ROOT)}: {n}" for n in _imports(path, pkg) for op in OPS if _names_op(n, op)
        ]
    assert not bad, "\n".join(bad)


def test_the_scan_sees_relative_imports(tmp_path: Path) -> None:
    """The check itself: a relative import of another op's module is found (it would pass vacuously
    otherwise)."""
    module = tmp_path / "copy_engine.py"
    module.write_text("from ..ag_gemm import copy_engine as ce\nfrom ..common.lanes import peer_lanes\n")
    names = _imports(module, "autotaxer.kernels.gemm_rs")
    assert any(_names_op(n, "ag_gemm") for n in names)
    assert "autotaxer.kernels.common.lanes" in names
