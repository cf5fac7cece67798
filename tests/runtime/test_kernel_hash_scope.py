"""The kernel hash covers the shared host modules of ``autotaxer.ops`` that a variant reaches (and only
those): an edit there re-stamps the variants that import it and leaves the others' records current."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotaxer.runtime import kernel_hash
from autotaxer.runtime.kernel_hash import kernel_source_hash, kernel_sources


def _clear_caches() -> None:
    for value in list(vars(kernel_hash).values()):
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


@pytest.fixture
def edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, Callable], None]]:
    """``edit(module, change)``: the hash reads ``change(source)`` for ``module`` from now on."""
    real = kernel_hash._origin
    edited: dict[str, Path] = {}

    def origin(name: str) -> Path | None:
        return edited.get(name) or real(name)

    def apply(module: str, change: Callable[[str], str]) -> None:
        path = real(module)
        assert path is not None, module
        copy = tmp_path / module / path.name  # the same file name: an ``__init__`` stays a package
        copy.parent.mkdir(parents=True)
        copy.write_text(change(path.read_text(encoding="utf-8")), encoding="utf-8")
        edited[module] = copy
        _clear_caches()

    monkeypatch.setattr(kernel_hash, "_origin", origin)
    _clear_caches()
    yield apply
    _clear_caches()


def _code_edit(source: str) -> str:
    return source + "\n_EDITED = 1\n"


def _docstring_edit(source: str) -> str:
    doc = ast.get_docstring(ast.parse(source), clean=False)
    assert doc, "the module has a docstring to edit"
    return source.replace(doc, "Another text, longer, about the same code.", 1)


#: A shared host module, a variant that reaches it (directly, or through ``ctx.iris()`` /
#: ``ctx.watch_slot()``) and one that does not.
SHARED = [
    ("autotaxer.ops._copy_engine", ("ag_gemm", "copy_engine"), ("ag_gemm", "push")),
    ("autotaxer.ops._copy_engine", ("gemm_rs", "copy_engine"), ("gemm_rs", "bsp")),
    ("autotaxer.ops._iris_heap", ("ag_gemm", "push"), ("ag_gemm", "bsp")),
    ("autotaxer.ops._peer_wait", ("flash_decode", "fused"), ("flash_decode", "bsp")),
    ("autotaxer.ops._matmul", ("ag_gemm", "bsp"), ("flash_decode", "bsp")),
    ("autotaxer.ops._torch_symm", ("ag_gemm", "torch_fused"), ("ag_gemm", "bsp")),
]


@pytest.mark.parametrize(("module", "user", "other"), SHARED)
def test_an_edit_to_a_shared_host_module_stales_only_its_users(edit, module, user, other) -> None:
    before = {v: kernel_source_hash(*v) for v in (user, other)}
    edit(module, _code_edit)
    assert kernel_source_hash(*user) != before[user], f"{module} edited: {user} kept its hash"
    assert kernel_source_hash(*other) == before[other], f"{module} edited: {other} changed"


@pytest.mark.parametrize("module", sorted({m for m, _, _ in SHARED}))
def test_a_docstring_edit_to_a_shared_host_module_keeps_every_hash(edit, module) -> None:
    variants = [v for m, user, other in SHARED for v in (user, other) if m == module]
    before = {v: kernel_source_hash(*v) for v in variants}
    edit(module, _docstring_edit)
    assert {v: kernel_source_hash(*v) for v in variants} == before


@pytest.mark.parametrize("module", ["autotaxer.ops", "autotaxer.ops._base", "autotaxer.ops.ag_gemm"])
def test_the_registry_and_the_contract_are_left_out(edit, module) -> None:
    """A new op, variant or integration (the registry, an op's registration, the contract) launches
    nothing new: every record stays current."""
    variants = [("ag_gemm", v) for v in ("push", "bsp", "copy_engine")] + [("flash_decode", "fused")]
    before = {v: kernel_source_hash(*v) for v in variants}
    edit(module, _code_edit)
    assert {v: kernel_source_hash(*v) for v in variants} == before


def test_run_context_services_are_followed_to_their_modules() -> None:
    """``ctx.iris()`` and ``ctx.watch_slot()`` are the contract's services a launch uses: a variant that
    calls them covers the modules behind them (found in ``RunContext``, wherever it is defined)."""
    push = kernel_sources("ag_gemm", "push")
    assert {"autotaxer.ops._iris_heap", "autotaxer.ops._peer_wait", "autotaxer.kernels.common.watch"} <= set(
        push
    )
    assert "autotaxer.ops._base" not in push and "autotaxer.ops" not in push
    assert not any("_peer_wait" in m or "_iris_heap" in m for m in kernel_sources("ag_gemm", "bsp"))
