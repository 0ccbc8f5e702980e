"""A server's output: log files on disk, followed into bounded in-memory tails.

A server writes its stdout and stderr to files in its working directory
(:data:`STDOUT_LOG`, :data:`STDERR_LOG`, opened with ``O_APPEND``), not to
pipes: a node that dies takes no pipe with it, so the server never gets
SIGPIPE and keeps logging for the next node to re-attach.

Each spawn starts new files; the previous spawns' logs are kept, rotated as
``<log>.1`` (the last spawn) to ``<log>.3`` (:data:`KEPT_SPAWNS`), so the
output of earlier crashes of a crash loop survives the restarts.

One :class:`LogReader` thread per stream reads what is appended (polling every
0.1 s at end of file) into a :class:`Tail` of the last ``limit`` bytes. When the
file grows past ``limit``, the tail is saved as ``<log>.earlier`` (replaced
atomically) and the file is truncated to zero; the server writes with
``O_APPEND``, so it carries on at the new end. While a node follows a server,
each stream uses at most about twice ``limit`` on disk. Bytes appended between
the reader's last read and the truncation are lost (the window is one
``fstat`` and one ``ftruncate`` long), as with logrotate's ``copytruncate``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

__all__ = [
    "KEPT_SPAWNS",
    "LOG_MODE",
    "OUTPUT_LIMIT",
    "STDERR_LOG",
    "STDOUT_LOG",
    "LogReader",
    "Tail",
    "create_logs",
    "decode",
    "exit_tail",
    "log_paths",
    "rotate",
]

#: Bytes of each stream kept by default, in memory and on disk.
OUTPUT_LIMIT = 1024 * 1024
STDOUT_LOG = "server.stdout.log"
STDERR_LOG = "server.stderr.log"
PREVIOUS = ".earlier"  # suffix of the saved tail of a truncated log (this spawn's)
KEPT_SPAWNS = 3  # earlier spawns' logs kept: <log>.1 (the last) .. <log>.3
LOG_MODE = 0o600  # logs, rotated logs and saved tails: the node's user only
_TAIL_BYTES = 4096  # ExitInfo.output_tail
_READ_CHUNK = 65536
_POLL = 0.1  # s between reads at end of file

_log = logging.getLogger(__name__)


class Tail:
    """The last ``limit`` bytes of a stream; ``dropped`` counts the bytes let go."""

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._limit = max(limit, 0)
        self._lock = threading.Lock()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._buf += chunk
            excess = len(self._buf) - self._limit
            if excess > 0:
                del self._buf[:excess]
                self.dropped += excess

    def skipped(self, count: int) -> None:
        """Count ``count`` bytes as let go without having been read."""
        with self._lock:
            self.dropped += count

    def data(self) -> bytes:
        with self._lock:
            return bytes(self._buf)

    def text(self) -> str:
        return decode(self.data(), self.dropped > 0)


def decode(data: bytes, cut: bool) -> str:
    """UTF-8 with replacement; a head ``cut`` mid-character loses its continuation bytes."""
    if cut:
        start = 0
        while start < min(3, len(data)) and 0x80 <= data[start] < 0xC0:
            start += 1
        data = data[start:]
    return data.decode("utf-8", errors="replace")


def exit_tail(out: Tail, err: Tail) -> str:
    """The last 4096 bytes of stdout followed by stderr (so an error message survives)."""
    out_data, err_data = out.data(), err.data()
    both = out_data + err_data
    cut = len(both) > _TAIL_BYTES or bool(out.dropped or (not out_data and err.dropped))
    return decode(both[-_TAIL_BYTES:], cut)


def log_paths(cwd: str) -> tuple[str, str]:
    """Where a server started in ``cwd`` writes (stdout, stderr)."""
    return os.path.join(cwd, STDOUT_LOG), os.path.join(cwd, STDERR_LOG)


def create_logs(cwd: str) -> tuple[int, int]:
    """New log files for a new server in ``cwd`` (the previous spawns' rotated,
    see :func:`rotate`); returns the (stdout, stderr) descriptors to hand to it
    (``O_APPEND``, close-on-exec). The caller closes them.

    Raises:
        OSError: a file could not be rotated or created.
    """
    fds: list[int] = []
    flags = os.O_WRONLY | os.O_TRUNC | os.O_APPEND
    try:
        for path in log_paths(cwd):
            rotate(path)
            fds.append(open_private(path, flags))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1]


def open_private(path: str, flags: int) -> int:
    """Open (creating) ``path`` with mode 0600 whatever the umask: a server's
    output may echo its spec's env or requests; other users do not read it.
    Close-on-exec. Raises OSError."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, LOG_MODE)
    try:
        os.fchmod(fd, LOG_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def rotate(path: str, keep: int = KEPT_SPAWNS) -> None:
    """Shift ``path`` to ``path.1``, ``path.1`` to ``path.2`` ... keeping ``keep``.

    A spawn's log is kept whole when it is renamed, with what a reader saved of
    it when it grew past its limit (``<log>.earlier``) prepended. A missing
    file is skipped.

    Raises:
        OSError: a file could not be renamed or written.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}.{keep}")
    for n in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}.{n}", f"{path}.{n + 1}")
            os.chmod(f"{path}.{n + 1}", LOG_MODE)  # one an older version left 0640
    earlier = path + PREVIOUS
    if not os.path.exists(earlier):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, f"{path}.1")
            os.chmod(f"{path}.1", LOG_MODE)
        return
    with (
        contextlib.suppress(FileNotFoundError),
        open(path, "rb") as current,
        os.fdopen(open_private(earlier, os.O_WRONLY | os.O_APPEND), "ab") as joined,
    ):
        while chunk := current.read(_READ_CHUNK):
            joined.write(chunk)
    os.replace(earlier, f"{path}.1")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class LogReader:
    """Follows one log file into a :class:`Tail` until ``stop`` is set, then
    reads what is left and returns. Run :meth:`run` on a thread of its own.

    ``resume`` (re-attaching): start from the saved ``<log>.1`` and the file's
    current content (its last ``limit`` bytes); otherwise from the start.
    """

    def __init__(
        self, path: str, tail: Tail, limit: int, stop: threading.Event, *, resume: bool
    ) -> None:
        self._path = path
        self._tail = tail
        self._limit = max(limit, 0)
        self._stop = stop
        self._resume = resume
        self._pos = 0
        self._following = False

    def caught_up(self) -> bool:
        """Everything the log holds now is in the tail and the file is within its
        limit (any thread): its reader follows it, has read to its end and has
        nothing left to do there. False while it has not begun, and while a file
        read past ``limit`` is not yet saved as ``<log>.earlier`` and emptied: an
        exit report that took such a reader as done came before the cut (a test
        found no ``.earlier`` after the exit), which a next spawn's rotation
        could then meet half done."""
        if not self._following or self._pos > self._limit:
            return False
        try:
            return os.stat(self._path).st_size == self._pos
        except OSError:
            return False

    def run(self) -> None:
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            _log.warning("not following %s: %s", self._path, e)
            return
        try:
            if self._resume:
                self._catch_up(fd)
            self._following = True
            self._follow(fd)
        except OSError as e:
            _log.warning("stopped following %s: %s", self._path, e)
        finally:
            os.close(fd)

    def _follow(self, fd: int) -> None:
        while True:
            last = self._stop.is_set()  # output written before the stop is read below
            self._drain(fd)
            if last:
                return
            self._stop.wait(_POLL)

    def _catch_up(self, fd: int) -> None:
        with contextlib.suppress(OSError), open(self._path + PREVIOUS, "rb") as f:
            self._tail.add(f.read())
        size = os.fstat(fd).st_size
        if size > self._limit:
            self._pos = os.lseek(fd, size - self._limit, os.SEEK_SET)
            self._tail.skipped(self._pos)

    def _drain(self, fd: int) -> None:
        """Read to the end of the file; truncate it once it holds more than ``limit``."""
        while True:
            if os.fstat(fd).st_size < self._pos:  # truncated by someone else
                self._pos = os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, _READ_CHUNK):
                self._tail.add(chunk)
                self._pos += len(chunk)
            if self._pos <= self._limit or self._truncate(fd):
                return

    def _truncate(self, fd: int) -> bool:
        """Save the tail as ``<log>.1`` and empty the file; False if the server wrote
        more in the meantime (read it first)."""
        self._save_previous()
        if os.fstat(fd).st_size != self._pos:
            return False
        os.ftruncate(fd, 0)
        self._pos = os.lseek(fd, 0, os.SEEK_SET)
        return True

    def _save_previous(self) -> None:
        temporary = self._path + PREVIOUS + ".tmp"
        with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(self._tail.data())
        os.replace(temporary, self._path + PREVIOUS)
