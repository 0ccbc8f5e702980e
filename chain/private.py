"""Files the node writes that hold specs, env values or request details are
private to the node's user: created 0600 (directories 0700) whatever the umask.

``os.open``'s mode is filtered by the umask, which can only remove bits; the
explicit ``fchmod``/``chmod`` afterwards makes the mode exact (a umask of 0
would otherwise leave nothing out, and one of 077 is not to be relied on).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FILE_MODE", "FOLDER_MODE", "create_private", "private_folder"]

FILE_MODE = 0o600
FOLDER_MODE = 0o700


def create_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY) -> int:
    """Create the new file ``path`` with mode 0600; its descriptor (close-on-exec).

    Raises:
        OSError: it exists (``O_EXCL``) or cannot be created.
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def private_folder(path: Path) -> Path:
    """Make ``path`` (and missing parents) a folder with mode 0700; ``path``.

    Raises:
        OSError: it cannot be created or its mode set.
    """
    path.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    path.chmod(FOLDER_MODE)
    return path
