"""The README runs as written on a CPU: its bash blocks top to bottom from a copy of the repository's root
(as the README says), its model block saved as ``my_model.py`` (as the README says) and started by the
README's ``torchrun`` line, then every command the text names inline (``python``/``torchrun`` of a
script of the repository); every line of the GPU block stops at once with one error line saying why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _readme import README, ROOT, blocks, model_snippet

#: Set-up lines: a fresh virtual environment, the install and the test suite itself (CI's .ci/run runs
#: exactly these on a clean machine); every other line of the README runs here.
SETUP = ("python3 -m venv .venv", "pip install ", "python -m pytest")
#: First line of the block whose lines need GPUs.
GPU_BLOCK = "# GPUs only"
#: What a copy of the repository leaves out (git's and the environment's folders, build outputs).
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", "*.sqlite", "*.sqlite-*"
)


def inline_commands(text: str) -> list[str]:
    """The commands the README's text names inline that run a script of the repository (``python x.py``,
    ``torchrun ... x.py``), whitespace as one space."""
    spans = (
        " ".join(m.split())
        for m in re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S))
    )
    return [c for c in spans if c.startswith(("python ", "torchrun ")) and re.search(r"\S+\.py\b", c)]


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


def _run(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    return proc.returncode, proc.stdout + proc.stderr


def _ran_clean(command: str, code: int, output: str) -> None:
    assert code == 0, (command, output)
    assert "Traceback" not in output and "Warning" not in output, (command, output)


@pytest.mark.slow
def test_every_readme_block_runs_as_written_on_a_cpu(tmp_path: Path) -> None:
    work = tmp_path / "repo"
    shutil.copytree(ROOT, work, ignore=NOT_COPIED)
    env = _env(tmp_path)
    ran, refused, setup = [], [], []
    text = README.read_text()
    assert len(text.splitlines()) <= 250  # a user guide; design notes go to docs/
    (work / "my_model.py").write_text(model_snippet())
    for language, lines in blocks(text):
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
            code, output = _run(command, work, env)
            if gpu:
                assert code == 2 and len(output.splitlines()) == 1, (command, output)
                assert output.startswith("error: ") and "Traceback" not in output, (command, output)
                refused.append(command)
            else:
                _ran_clean(command, code, output)
                ran.append(command)
    inline = inline_commands(text)
    for command in inline:
        _ran_clean(command, *_run(command, work, env))
    assert [c.split()[0] for c in setup] == ["python3", "pip", "python"]  # the set-up block CI runs
    assert len(refused) >= 4 and len(ran) >= 12, (ran, refused)
    assert any(c.startswith("torchrun") for c in ran) and (work / "report" / "index.html").is_file()
    assert any("examples/tp_block.py" in c for c in inline) and any("bench/layer.py" in c for c in inline)
    assert any("bench/layer.py" in c for c in refused)
    # what the steps made: the table the Python block loaded, the re-tune merged into it, the misses
    for name in ("my-table.json", "new.json", "bench.json", "next.csv", "retune.sqlite"):
        assert (work / name).is_file(), name


def test_inline_commands_are_found_across_line_breaks() -> None:
    text = "Run `torchrun\n--nproc-per-node 2 examples/x.py` or `python bench/y.py --a 1`,\n"
    text += "not `python -m pytest`.\n```bash\npython in_a_block.py\n```\n"
    assert inline_commands(text) == ["torchrun --nproc-per-node 2 examples/x.py", "python bench/y.py --a 1"]
