"""Every command's help reads one way: integers as ``<int>`` (never ``<int range> [x>=1]``), choices
listed, ``-q`` wherever ``--quiet`` is, arguments named plainly in the usage line (``FILE``, not
``{FILE}``), and the root help names every op."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autotaxer.cli import app

COMMANDS = ("tune", "show", "export", "import", "merge", "misses", "bench", "report", "doctor")


def _help(*command: str) -> str:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_options_read_one_way(command: str) -> None:
    text = _help(command)
    assert "int range" not in text and "x>=" not in text, text
    assert "--quiet" not in text or "-q, --quiet" in text, text
    assert "--symm-mem" not in text or "--symm-mem <cuda|nccl>" in text, text
    assert "{" not in text.splitlines()[0], text  # the usage line names arguments as the help does


def test_a_count_below_one_is_a_usage_error_naming_the_option() -> None:
    result = CliRunner().invoke(app, ["show", "--world-size", "0"])
    assert result.exit_code == 2 and "--world-size" in result.output and "at least 1, got 0" in result.output


def test_the_root_help_names_every_op() -> None:
    text = " ".join(_help().split())
    assert "all-gather + GEMM" in text and "GEMM + reduce-scatter" in text and "flash decoding" in text
