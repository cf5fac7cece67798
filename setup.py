"""The package list, generated: every package folder under each root of pyproject.toml's
``[tool.setuptools] package-dir`` (that table says why some top-level folders install under ``autotaxer.``).
Everything else about the build is in pyproject.toml."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def package_dir() -> dict[str, str]:
    """Import name -> folder of each package root, as pyproject.toml maps them."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli that setuptools reads pyproject.toml with
        import tomli as tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(config["tool"]["setuptools"]["package-dir"])


def packages(roots: dict[str, str]) -> list[str]:
    """Every package under ``roots`` (import name -> folder): the root and its subpackages."""
    found = []
    for name, folder in roots.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(str(ROOT / folder)))]
    return sorted(found)


if __name__ == "__main__":
    setup(packages=packages(package_dir()))
