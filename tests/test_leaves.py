"""The ops are leaves and the runtime sits below the integrations: ``autotaxer/ops/`` and the kernels
import nothing of the runtime, the tuner, the commands, the tools, the test helpers or the integration
layer, and ``autotaxer/runtime/`` imports none of the integration layer, the commands or the tuner. Every
import is read from the source (lazy ones inside functions included), relative ones resolved."""

from __future__ import annotations

from pathlib import Path

from _imports import imported

ROOT = Path(__file__).resolve().parents[1]

#: What an op (its folder, the registry, the shared op modules) and a kernel must never import.
ABOVE_THE_OPS = ("runtime", "tuner", "cli", "tools", "testing", "integrations")
#: What the runtime must never import: the layers above it.
ABOVE_THE_RUNTIME = ["integrations", "cli", "tuner"]


def _sources(folder: Path, package: str) -> list[tuple[Path, str]]:
    """``(file, the package its relative imports start in)`` of every module under ``folder``."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
        out.append((path, ".".join(parts[:-1])))
    return out


def upward(sources: list[tuple[Path, str]], above: list[str] | tuple[str, ...]) -> list[str]:
    """``file -> module`` for every import of ``sources`` that resolves into ``autotaxer.<one of above>``
    (``from autotaxer import X`` included)."""
    banned = tuple(f"autotaxer.{part}" for part in above)
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name} -> {name}"
        for path, package in sources
        for name in sorted(imported(path, package))
        if name in banned or name.startswith(tuple(f"{b}." for b in banned))
    ]


def test_the_ops_and_kernels_import_nothing_above_them() -> None:
    sources = _sources(ROOT / "autotaxer" / "ops", "autotaxer.ops")
    sources += _sources(ROOT / "kernels", "autotaxer.kernels")
    assert len(sources) > 40  # every op's folder and the kernels were read
    assert upward(sources, ABOVE_THE_OPS) == []


def test_the_runtime_imports_nothing_above_it() -> None:
    sources = _sources(ROOT / "autotaxer" / "runtime", "autotaxer.runtime")
    assert upward(sources, ABOVE_THE_RUNTIME) == []


def test_the_scan_sees_lazy_relative_and_package_imports(tmp_path: Path) -> None:
    """An import inside a function, a relative one and ``from autotaxer import runtime`` are all seen."""
    op = tmp_path / "ops" / "some_op"
    op.mkdir(parents=True)
    (op / "variant.py").write_text(
        "from ..._problem import ProblemKey\n"
        "def run():\n"
        "    from ...runtime.dispatch import runtime_for\n"
        "    import autotaxer.integrations.compiled\n"
        "from autotaxer import testing\n"
    )
    sources = [(op / "variant.py", "autotaxer.ops.some_op")]
    hits = [h.rpartition(" -> ")[2] for h in upward(sources, ABOVE_THE_OPS)]
    assert hits == [
        "autotaxer.integrations.compiled",
        "autotaxer.runtime.dispatch",
        "autotaxer.runtime.dispatch.runtime_for",
        "autotaxer.testing",
    ]
