"""The data_dir's run lock: one ``infervisor run`` per data directory.

``run.lock`` in the data_dir is held with ``flock`` while a node runs there,
and holds the pid of its holder (named when a second run, or ``chain
rotate-key``, is refused). The kernel lets it go when the process ends, so a
killed node leaves no stale lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infervisor.actors.settings import NodeSettings

__all__ = ["LOCK_FILE", "ChainRefused", "RunError", "claim_data_dir", "holds_no_run"]

#: Held (``flock``) in the data_dir while a node runs there: one node per data_dir.
LOCK_FILE = "run.lock"


class RunError(Exception):
    """The node cannot run as configured; the message says what, where and how to fix it.

    ``exit_status``: what ``infervisor run`` exits with (docs/cli.md, "Exit
    status"): 2, the config or its data directory cannot be used (usage)."""

    exit_status = 2


class ChainRefused(RunError):
    """The chain failed its check at boot (a bad row, a checkpoint or witness it fails
    against, an event that cannot be replayed, a witness's refusal): a finding about
    the data, exit 1 as every reader refusing a chain (``chain_invalid``), not usage
    (a newcomer's trial, stop 34, read exit 2)."""

    exit_status = 1


@contextlib.contextmanager
def claim_data_dir(settings: NodeSettings) -> Iterator[None]:
    """Create the data and registry folders and hold the data_dir's run lock.

    Raises:
        RunError: a folder cannot be created or written, or another run holds the lock.
    """
    data_dir = Path(settings.data_dir)
    for folder, key in ((data_dir, "data_dir"), (settings.registry_path, "registry_dir")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"{key} {folder}: cannot create it: {e.strerror or e}") from e
    lock = data_dir / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunError(f"data_dir {data_dir}: cannot write there: {e.strerror or e}") from e
    try:
        _lock(fd, data_dir)
        yield
    finally:
        os.close(fd)  # releases the lock


def holds_no_run(lock: Path) -> None:
    """Check that no ``infervisor run`` holds the run lock at ``lock`` (a missing
    file is no run); the lock is let go at once.

    Raises:
        RunError: a run holds it (naming its pid), or it cannot be checked.
    """
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return
    except OSError as e:
        raise RunError(f"{lock}: cannot check the run lock: {e.strerror or e}") from e
    try:
        holder = _try_lock(fd, f"{lock}: cannot check the run lock")
        if holder is not None:
            raise RunError(f"a node runs on {lock.parent} (pid {holder}); stop it first")
    finally:
        os.close(fd)


def _try_lock(fd: int, cannot: str) -> str | None:
    """Take the run lock on ``fd`` without waiting: None when taken, else the
    pid its holder wrote (or "unknown").

    Raises:
        RunError: ``cannot`` and why, when the lock cannot be asked at all.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise RunError(f"{cannot}: {e.strerror or e}") from e
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return None


def _lock(fd: int, data_dir: Path) -> None:
    holder = _try_lock(fd, f"data_dir {data_dir}: cannot lock it")
    if holder is not None:
        raise RunError(
            f"data_dir {data_dir} is in use by another infervisor run (pid {holder}); "
            "one node runs per data_dir: stop that one or give this config its own data_dir"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
