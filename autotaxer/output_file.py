"""Files the commands write (exported tables, benchmark results, reports): checked before any work, written
whole, and never put in the place of something that is not a regular file.

:func:`output_path` is the check: an existing path must be a regular file (a symlink counts as its target,
which is written, as editors do; a directory, a device, a FIFO or a socket is refused with
:class:`OutputPathError`, a ``ValueError``: the commands exit 2 and leave it as it was).
:func:`write_atomic` writes through a temporary file in the target's folder, renamed over it: a reader
sees the old file or the new one. A new file gets ``0666`` less the umask (``0644`` under the
usual ``022``: tables are for sharing); a replaced one keeps its mode.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """A path a command was asked to write is not a regular file or cannot hold one."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def output_path(path: str | os.PathLike[str], what: str = "--out", make_folder: bool = False) -> Path:
    """The file to write for ``path`` (a symlink resolved to its target); :class:`OutputPathError` naming
    ``what`` when it exists and is not a regular file. ``make_folder``: its folder is created (else a
    missing folder is the writer's ``FileNotFoundError``)."""
    given = Path(path)
    target = Path(os.path.realpath(given))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise OutputPathError(f"{what}: {given}: cannot inspect it: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        via = f" (through the symlink {given})" if target != given.absolute() else ""
        raise OutputPathError(f"{what}: {target}{via} is {kind}; refusing to replace it with a file")
    if make_folder:
        target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(
    path: str | os.PathLike[str], data: str | bytes, what: str = "--out", make_folder: bool = False
) -> Path:
    """Write ``data`` to ``path`` whole (temporary file renamed over it) after :func:`output_path`'s
    check; return the file written. Text is written as UTF-8."""
    target = output_path(path, what, make_folder)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target
