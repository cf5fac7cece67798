"""The op is the unit: the parts that serve every op find it in the registry and name none, and the
registry's lines (and ``$AUTOTAXER_OPS``) are what makes an op known."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autotaxer.integrations import form
from autotaxer.ops import REGISTRY, get_op, layer_op, op_names, ops_with

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autotaxer"

#: Modules of the package that may name an op, each with its reason; every other module outside the ops'
#: own folders (``autotaxer/ops/<op>/``) must find ops in the registry.
MAY_NAME_OPS = {
    "ops": "the ops themselves (their folders and the registry's lines)",
    "integrations/ag_gemm.py": "ag_gemm's integrations (custom ops, autograd, functions, bench row)",
    "integrations/gemm_rs.py": "gemm_rs's integrations (custom ops, autograd, functions, bench row)",
    "integrations/__init__.py": "the integration layer's registry: op -> the module of its forms",
    "async_tp.py": "maps torch's two fused ops to the autotaxer ops that serve them",
    "models": "a model, which uses ops through autotaxer.nn's layers",
    "testing": "test programs and planted variants written against one op",
    "tools/restamp.py": "re-stamps the records of one op's fused kernels",
    "tools/sm90.py": "inspects one op's compiled kernels",
    "tools/wait_kernels.py": "inspects one op's compiled kernels",
    "tools/ws_model.py": "a cost model of one op's kernels",
    "tools/_fingerprint.py": "fingerprints one op's kernel launches (for restamp)",
    "tools/one_rank.py": "times one op's fused kernel at one rank (for the bench scripts)",
}


def _scanned() -> list[Path]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not any(rel == k or rel.startswith(k + "/") for k in MAY_NAME_OPS):
            out.append(path)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of ``tree`` (prose may give an op as an example)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _named_ops(path: Path, names: list[str]) -> list[str]:
    """``file:line: what`` for every op name in ``path``'s code: strings, identifiers and imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        elif isinstance(node, ast.arg):
            texts = [node.arg]
        hits = [op for op in names for text in texts if op in text]
        if hits:
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            found.append(f"{where}:{getattr(node, 'lineno', '?')}: {hits[0]}")
    return found


def test_only_the_ops_own_folders_name_an_op() -> None:
    names = list(REGISTRY)
    scanned = _scanned()
    rel = {p.relative_to(PACKAGE).as_posix() for p in scanned}
    must = {"benchmark/rank.py", "benchmark/run.py", "functional.py", "nn.py"}
    must |= {"integrations/compiled.py", "integrations/autograd.py", "integrations/dispatch.py"}
    must |= {"runtime/dispatch.py", "cli/bench.py", "cli/tune.py", "tools/emulated_ranks.py", "tuner/run.py"}
    assert must <= rel, sorted(must - rel)
    named = [hit for path in scanned for hit in _named_ops(path, names)]
    assert named == [], "\n".join(named)


def test_the_scan_sees_an_op_named_in_code(tmp_path: Path) -> None:
    """The scan finds names in strings, f-strings, identifiers and imports, and passes docstrings."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""dispatch("ag_gemm", ...) in prose is fine."""\n'
        "from autotaxer.ops.gemm_rs import OP\n"
        "def f(op):\n"
        '    """gemm_rs: fine here too."""\n'
        '    return f"{op}" == "flash_decode" or check_ag_gemm\n'
    )
    lines = [hit.rpartition(":")[2].strip() for hit in _named_ops(bad, list(REGISTRY))]
    assert sorted(lines) == ["ag_gemm", "flash_decode", "gemm_rs"]


def test_registry_lines_load_every_op_with_its_name() -> None:
    assert op_names() == sorted(REGISTRY)
    for name in REGISTRY:
        assert get_op(name).name == name
    with pytest.raises(KeyError, match="known: ag_gemm"):
        get_op("nope")


def test_layers_and_integrations_come_from_the_ops() -> None:
    assert layer_op("column").layer.layout == {"gather_dim": 0}
    assert layer_op("row").layer.layout == {"scatter_dim": 0}
    assert {op.name for op in ops_with("compiled")} == {"ag_gemm", "gemm_rs"}
    for op in ops_with("bench"):  # every integration an op declares has its form
        for kind in op.integrations:
            assert form(op, kind) is not None, (op.name, kind)
    assert form("flash_decode", "compiled") is None
    assert form("flash_decode", "emulated") is get_op("flash_decode").forms["emulated"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [("planted", "not name=package"), ("x=autotaxer.ops.ag_gemm", "registered as 'x'")],
)
def test_bad_env_entry_is_named(monkeypatch: pytest.MonkeyPatch, value: str, problem: str) -> None:
    """A malformed ``$AUTOTAXER_OPS`` entry, or one whose package's op has another name, is refused with
    the entry named."""
    import autotaxer.ops as registry

    monkeypatch.setattr(registry, "_OPS", {})
    monkeypatch.setenv(registry.ENV_VAR, value)
    with pytest.raises(ValueError, match=problem):
        registry.op_names()


def test_variants_of_the_environment_are_registered_on_their_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """``$AUTOTAXER_VARIANTS`` (``op=module``) registers a module's ``VARIANTS`` on that op, which is how
    the tests' planted faults reach spawned workers without the op naming them; a bad entry is named."""
    import autotaxer.ops as registry
    from autotaxer.testing.planted import ENV

    monkeypatch.setattr(registry, "_OPS", {})
    monkeypatch.delenv(registry.VARIANTS_ENV_VAR, raising=False)
    op = registry.get_op("ag_gemm")
    assert "planted_hang" not in op.variants
    # the variants register on the op's package instance: restored after, or this process's later tests
    # (in-process tuning of every variant) would run planted_hang, which never returns
    monkeypatch.setattr(op, "_variants", dict(op._variants))
    for var, value in ENV.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(registry, "_OPS", {})
    assert {"planted_hang", "planted_wrong", "bsp"} <= set(registry.get_op("ag_gemm").variants)
    for value, problem in (("ag_gemm", "not op=module"), ("nope=autotaxer.testing.planted", "'nope'")):
        monkeypatch.setenv(registry.VARIANTS_ENV_VAR, value)
        monkeypatch.setattr(registry, "_OPS", {})
        with pytest.raises(ValueError, match=problem):
            registry.op_names()
