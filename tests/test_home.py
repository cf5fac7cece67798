"""The tests leave the user's home alone: every default location points into the session's private
folder, in this process and in the processes it starts, and a write into a watched place of a home is seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _home


def _defaults() -> dict[str, str]:
    """Where autotaxer, Triton and inductor write by default, as this process resolves them."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from triton.runtime.cache import knobs

    from autotaxer.runtime.misses import default_misses_path
    from autotaxer.storage import default_url

    return {
        "home": str(Path.home()),
        "misses": str(default_misses_path()),
        "database": default_url().removeprefix("sqlite:///"),
        "triton": str(knobs.cache.dir),
        "inductor": cache_dir(),
    }


def _outside(paths: dict[str, str], home: Path) -> dict[str, str]:
    return {k: v for k, v in paths.items() if Path(v).resolve().is_relative_to(home)}


def test_every_default_location_is_outside_the_users_home() -> None:
    home = _home.real_home()
    assert _outside(_defaults(), home) == {}
    assert not any(os.environ.get(name) for name in _home.USER_SETTINGS)


def test_a_started_process_inherits_the_private_locations() -> None:
    code = "import json, test_home; print(json.dumps(test_home._defaults()))"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert _outside(json.loads(out.stdout), _home.real_home()) == {}


def test_a_write_into_a_watched_place_is_seen(tmp_path: Path) -> None:
    before = _home.watched_state(tmp_path)
    misses = tmp_path / ".local" / "share" / "autotaxer" / "misses.jsonl"
    misses.parent.mkdir(parents=True)
    assert _home.changed_since(before, tmp_path) == [str(misses.parent)]
    before = _home.watched_state(tmp_path)
    misses.write_text("{}\n")
    assert _home.changed_since(before, tmp_path) == [str(misses.parent), str(misses)]
    before = _home.watched_state(tmp_path)
    with misses.open("a") as f:
        f.write("{}\n")
    assert _home.changed_since(before, tmp_path) == [str(misses)]
    cache = tmp_path / ".triton" / "cache"
    cache.mkdir(parents=True)
    before = _home.watched_state(tmp_path)
    (cache / "0123abcd").mkdir()  # a kernel compiled
    assert _home.changed_since(before, tmp_path) == [str(cache), str(cache / "0123abcd")]
