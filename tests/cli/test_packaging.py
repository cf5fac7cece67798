"""setup.py's generated package list holds every package folder; the CLI entry point resolves."""

from __future__ import annotations

import ast
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_folders() -> dict[str, Path]:
    """Import name -> folder, for every folder holding an __init__.py (package-dir mapping applied)."""
    setuptools = _config()["tool"]["setuptools"]
    roots = {name: ROOT / folder for name, folder in setuptools["package-dir"].items()}
    found = {}
    for import_root, folder in roots.items():
        if not folder.is_dir():
            continue
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            if "__pycache__" in rel:
                continue
            found[".".join((import_root, *rel))] = init.parent
    return found


def test_generated_package_list_holds_every_package_folder():
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")  # not "__main__": no build
    roots = setup["package_dir"]()
    assert roots == _config()["tool"]["setuptools"]["package-dir"]
    found = _package_folders()
    assert {"autotaxer", "autotaxer.kernels.common", "autotaxer.migrations.versions"} <= set(found)
    assert setup["packages"](roots) == sorted(found)


def test_pyproject_keeps_no_hand_list_of_packages():
    assert "packages" not in _config()["tool"]["setuptools"], "setup.py generates the package list"


def test_migration_template_is_package_data():
    data = _config()["tool"]["setuptools"]["package-data"]["autotaxer.migrations"]
    assert "script.py.mako" in data and (ROOT / "migrations" / "script.py.mako").is_file()


def test_console_script_and_light_import():
    assert _config()["project"]["scripts"]["autotaxer"] == "autotaxer.cli:main"
    code = (
        "import json, sys, autotaxer, autotaxer.cli; "
        "print(json.dumps(sorted(m for m in ('sqlalchemy', 'optuna', 'triton', 'iris') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    heavy = json.loads(out)
    assert "sqlalchemy" not in heavy and "optuna" not in heavy and "iris" not in heavy


def test_help_runs_as_a_module_without_gpu(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from autotaxer.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stderr
    assert "export" in result.stdout and "doctor" in result.stdout


#: Import name -> the distribution that provides it (PyPI names), for every third-party import.
DISTRIBUTIONS = {
    "alembic": "alembic",
    "cuda.bindings": "cuda-bindings",
    "iris": "tokenspeed-iris",
    "matplotlib": "matplotlib",
    "numpy": "numpy",
    "optuna": "optuna",
    "rich": "rich",
    "sqlalchemy": "sqlalchemy",
    "torch": "torch",
    "triton": "triton",
    "typer": "typer",
}


def _imported(folder: Path) -> dict[str, str]:
    """Third-party modules imported anywhere in ``folder`` (inside functions too) -> a file importing it;
    ``cuda`` by its subpackage (``cuda.bindings``: the namespace package has other distributions)."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                top = ".".join(parts[:2]) if parts[0] == "cuda" else parts[0]
                if parts[0] not in sys.stdlib_module_names and parts[0] != "autotaxer":
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_declared():
    project = _config()["project"]
    declared = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in extra}
    imported = {}
    for folder in ("autotaxer", "kernels", "migrations"):
        imported.update(_imported(ROOT / folder))
    assert "torch" in imported and "cuda.bindings" in imported  # the scan sees imports inside functions
    unknown = {m: f for m, f in imported.items() if m not in DISTRIBUTIONS}
    assert not unknown, f"imports of no known distribution (add to DISTRIBUTIONS and pyproject): {unknown}"
    undeclared = {m: DISTRIBUTIONS[m] for m in imported if DISTRIBUTIONS[m] not in declared}
    assert not undeclared, f"imported but declared nowhere in pyproject.toml: {undeclared}"
