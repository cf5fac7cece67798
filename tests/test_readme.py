"""The README runs as written on a CPU: its bash blocks top to bottom in a scratch folder laid out like the
repository's root, its Python block saved as ``my_model.py`` (as the README says) and started by the
README's ``torchrun`` line; every line of the GPU block stops at once with an error saying why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Set-up lines: a fresh virtual environment, the install and the test suite itself (CI's .ci/run runs
#: exactly these on a clean machine); every other line of the README runs here.
SETUP = ("python3 -m venv .venv", "pip install ", "python -m pytest")
#: First line of the block whose lines need GPUs.
GPU_BLOCK = "# GPUs only"


def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of ``text`` in order: ``(language, lines)``."""
    return [(m[1], m[2].splitlines()) for m in re.finditer(r"^```(\w+)\n(.*?)^```$", text, re.M | re.S)]


def _env(tmp_path: Path) -> dict[str, str]:
    """This interpreter's commands first on PATH (and ``torchrun`` where its script is missing), the
    default database and misses file inside ``tmp_path``, 80 columns."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        shim = bin_dir / "torchrun"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTAXER_")}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), COLUMNS="80", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.mark.slow
def test_every_readme_block_runs_as_written_on_a_cpu(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = _env(tmp_path)
    ran, refused, setup = [], [], []
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250  # a user guide; design notes go to docs/
    for language, lines in _blocks(text):
        if language == "python":
            (work / "my_model.py").write_text("\n".join(lines) + "\n")
            continue
        if language != "bash":
            continue
        gpu = bool(lines) and lines[0].startswith(GPU_BLOCK)
        for line in lines:
            command = line.strip()
            if not command or command.startswith("#"):
                continue
            if command.startswith(SETUP):
                setup.append(command)
                continue
            proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=600)  # fmt: skip
            output = proc.stdout + proc.stderr
            if gpu:
                assert proc.returncode == 2, (command, output)
                assert output.startswith("error: ") and "Traceback" not in output, (command, output)
                refused.append(command)
            else:
                assert proc.returncode == 0, (command, output)
                assert "Traceback" not in output and "Warning" not in output, (command, output)
                ran.append(command)
    assert [c.split()[0] for c in setup] == ["python3", "pip", "python"]  # the set-up block CI runs
    assert len(refused) >= 3 and len(ran) >= 12, (ran, refused)
    assert any(c.startswith("torchrun") for c in ran) and (work / "report" / "index.html").is_file()
    # what the steps made: the table the Python block loaded, the re-tune merged into it, the misses
    for name in ("my-table.json", "new.json", "bench.json", "next.csv", "retune.sqlite"):
        assert (work / name).is_file(), name
