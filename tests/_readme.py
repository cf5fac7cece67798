"""The README's code blocks, for the tests that run them as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def blocks(text: str | None = None) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of ``text`` (default: the README) in order: ``(language, lines)``."""
    text = README.read_text() if text is None else text
    return [(m[1], m[2].splitlines()) for m in re.finditer(r"^```(\w+)\n(.*?)^```$", text, re.M | re.S)]


def model_snippet() -> str:
    """The README's model (its Python block that a user saves as ``my_model.py``)."""
    found = [
        lines
        for language, lines in blocks()
        if language == "python" and "init_process_group" in "\n".join(lines)
    ]
    assert len(found) == 1, "the README has one model block"
    return "\n".join(found[0]) + "\n"
