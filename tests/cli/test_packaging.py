"""setup.py's generated package list holds every package folder; the CLI entry point resolves."""

from __future__ import annotations

import json
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


def test_help_runs_as_a_module_without_gpu():
    result = subprocess.run(
        [sys.executable, "-c", "from autotaxer.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "HOME": str(ROOT), "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stderr
    assert "export" in result.stdout and "doctor" in result.stdout
