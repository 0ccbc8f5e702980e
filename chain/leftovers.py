"""Temporary files of chain tools, named so that a later run can remove what a
killed one left (issue 18, item 8).

``chain backup`` and ``chain export`` write aside and rename into place. The
file (or directory) aside is named ``.<target name>.infervisor-partial-<what>-<pid>``
beside the target: a run killed mid-way (kill -9, power loss) leaves it, and
the next run of either command in that directory removes every such entry
whose process is gone, and says so (:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

__all__ = ["Leftover", "partial_name", "sweep"]

_MARK = ".infervisor-partial-"
_NAME = re.compile(r"^\..+\.infervisor-partial-(backup|export)-([0-9]+)(-journal|-wal|-shm)?$")


class Leftover(NamedTuple):
    """A temporary file or directory removed: its path and the pid of the run that left it."""

    path: Path
    pid: int


def partial_name(target: Path, what: str) -> Path:
    """The name aside of `target` for this process (`what`: "backup" or "export")."""
    return target.parent / f".{target.name}{_MARK}{what}-{os.getpid()}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def sweep(folder: Path) -> list[Leftover]:
    """Remove the temporary files and directories of killed runs in `folder`.

    Only names of the form above whose pid is no running process are removed
    (a running backup or export keeps its own). Errors removing one are ignored
    (it stays for the next run).
    """
    removed: list[Leftover] = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or _alive(int(match[2])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(Leftover(entry, int(match[2])))
    return removed
