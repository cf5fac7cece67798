"""The tests' private home: every default location a test (or a rank, torchrun or command it starts)
could write to points into a temporary folder of the session, and the places the tools write by default
under the user's real home are watched."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: The user's settings that would point a test at the user's own database, table, misses or ops.
USER_SETTINGS = ("AUTOTAXER_DB", "AUTOTAXER_TABLE", "AUTOTAXER_MISSES", "AUTOTAXER_OPS", "AUTOTAXER_SYMM_MEM",
                 "AUTOTAXER_PEER_TIMEOUT")  # fmt: skip
#: Places under the real home that the tools the tests run write by default (autotaxer's database and
#: misses, Triton's and torch's caches, matplotlib's config): each is watched around every test.
WATCHED = (".local/share/autotaxer", ".triton", ".triton/cache", ".cache/torch", ".cache/matplotlib",
           ".config/matplotlib")  # fmt: skip
_REAL_HOME: list[Path] = []  # the user's home, before the session's private one replaced it
_PRIVATE: list[str] = []  # the session's private folder (removed at the end)


def enter_private_home() -> None:
    """Point every default location at a private folder of this session (spawned ranks, torchrun and
    command-line runs inherit it): home, XDG data/cache/config, Triton's and inductor's caches."""
    _REAL_HOME[:] = [real_home()]
    os.environ[REAL_HOME_VAR] = str(_REAL_HOME[0])
    root = Path(tempfile.mkdtemp(prefix="autotaxer-tests-"))
    _PRIVATE[:] = [str(root)]
    for name in USER_SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(
        HOME=str(root / "home"),
        XDG_DATA_HOME=str(root / "data"),
        XDG_CACHE_HOME=str(root / "cache"),
        XDG_CONFIG_HOME=str(root / "config"),
        TRITON_HOME=str(root / "triton"),
        TRITON_CACHE_DIR=str(root / "triton" / "cache"),
        TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
        MPLCONFIGDIR=str(root / "matplotlib"),
    )
    (root / "home").mkdir()


#: Where the user's home is kept for the processes a session starts (pytest-xdist's workers inherit the
#: controller's private home, so they read the real one from here).
REAL_HOME_VAR = "_AUTOTAXER_TESTS_REAL_HOME"


def real_home() -> Path:
    """The user's home (as it was before the first :func:`enter_private_home` of this run)."""
    if _REAL_HOME:
        return _REAL_HOME[0]
    return Path(os.environ.get(REAL_HOME_VAR) or os.path.expanduser("~")).resolve()


def watched_state(home: Path | None = None) -> dict[str, tuple[int, int]]:
    """``(mtime_ns, size)`` of every watched place of ``home`` (default: the real home) and of each entry
    in it (a file written or a folder created there changes one of them)."""
    state = {}
    for rel in WATCHED:
        path = (home or real_home()) / rel
        entries = [path, *path.iterdir()] if path.is_dir() else [path]
        for p in entries:
            try:
                st = p.stat()
            except OSError:
                continue
            state[str(p)] = (st.st_mtime_ns, st.st_size)
    return state


def changed_since(before: dict[str, tuple[int, int]], home: Path | None = None) -> list[str]:
    """The watched paths of ``home`` (default: the real home) created, changed or removed since ``before``."""
    after = watched_state(home)
    return sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p))


def leave_private_home() -> None:
    """Remove the session's private folder."""
    for folder in _PRIVATE:
        shutil.rmtree(folder, ignore_errors=True)
