"""The walk of a tune (issue 50): from ``autotaxer tune`` to the stored winner, the calls on the stack when
the winner is written pass through at most 10 of the package's files, one way down (commands, then the
tuner, then the storage; never back up). CPU, one spawned gloo rank, a grid of the CPU variants."""

from __future__ import annotations

import traceback
from pathlib import Path

from typer.testing import CliRunner

import autotaxer
from autotaxer.cli import app

PACKAGE = Path(autotaxer.__file__).resolve().parent
#: the layers a tune's stack may cross, outermost first (a file outside them is the problem's vocabulary)
LAYERS = ("cli", "tuner", "storage")
MAX_FILES = 10


def _layer(path: str) -> int | None:
    part = Path(path).resolve().relative_to(PACKAGE).parts[0]
    return LAYERS.index(part) if part in LAYERS else None


def test_a_tune_stores_its_winner_through_at_most_ten_files_one_way_down(tmp_path, monkeypatch) -> None:
    from autotaxer.storage import _winners

    stacks: list[list[str]] = []
    write = _winners.write_one

    def spy(*args, **kwargs):
        files = [f.filename for f in traceback.extract_stack()]
        inside = [f for f in files if Path(f).resolve().is_relative_to(PACKAGE)]
        stacks.append(list(dict.fromkeys(inside)))  # each file once, in the order first on the stack
        return write(*args, **kwargs)

    monkeypatch.setattr(_winners, "write_one", spy)
    shapes = tmp_path / "s.csv"
    shapes.write_text("M,N,K,dtype\n16,8,8,fp32\n")
    db = f"sqlite:///{tmp_path}/t.sqlite"
    args = ["tune", "--device", "cpu", "--world-size", "1", "--shapes", str(shapes), "--db", db]
    result = CliRunner(env={"AUTOTAXER_DB": None, "COLUMNS": "200"}).invoke(app, [*args, "--trials", "2"])
    assert result.exit_code == 0, result.output
    assert stacks, "no winner was written"
    for files in stacks:
        listing = "\n  ".join(str(Path(f).resolve().relative_to(PACKAGE)) for f in files)
        assert len(files) <= MAX_FILES, f"the write's stack crosses {len(files)} files:\n  {listing}"
        layers = [n for n in map(_layer, files) if n is not None]
        assert layers == sorted(layers), f"the stack goes back up a layer:\n  {listing}"
        assert layers[0] == 0 and layers[-1] == LAYERS.index("storage"), listing
