"""Launch records: the file protocol shared with the exit-status shim.

Each launch has a token (:func:`new_token`). The shim (``shim.py``, which
writes these files and cannot import this module: it is standard-library
only) records the launch in ``<cwd>/launch/<token>.json`` as soon as the
server exists, and its exit status in ``<cwd>/launch/<token>.exit.json`` when
it ends, whether or not a node is alive. This module reads them, names their
paths, and prepares and prunes the ``launch`` directory. The format is
described in ``shim.py``'s docstring and ``docs/process-supervision.md``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
import uuid
from typing import TypeVar

import msgspec

from .errors import SpawnError
from .identity import ProcessIdentity, find_process, identity_of
from .system import REAL
from .table import same_start

__all__ = [
    "EXIT_RECORD_WAIT",
    "KEEP_LAUNCHES",
    "LAUNCH_DIR",
    "RECORD_POLL",
    "TOKEN_VAR",
    "ExitRecord",
    "LaunchRecord",
    "alive",
    "await_exit_record",
    "check_token",
    "launch_files",
    "new_token",
    "prepare_launch_dir",
    "read_exit_record",
    "read_exit_status",
    "read_launch_record",
]

#: The variable holding the launch token, in the shim's and the server's environment.
TOKEN_VAR = "INFERVISOR_LAUNCH_TOKEN"  # noqa: S105 -- a variable name, not a secret
#: Where the launch and exit records are kept, under the server's working directory.
LAUNCH_DIR = "launch"
#: Seconds an exit report waits for the shim's exit record once the server is gone.
EXIT_RECORD_WAIT = 2.0
#: Launches (other than the current one) whose records are kept in ``LAUNCH_DIR``.
KEEP_LAUNCHES = 4
#: Seconds between looks for a record the shim is about to write.
RECORD_POLL = 0.01

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_log = logging.getLogger(__name__)


class LaunchRecord(msgspec.Struct, frozen=True):
    """``<cwd>/launch/<token>.json``, written by the shim as soon as the server exists.

    ``pid`` and ``pgid`` are the server's (equal: it leads its own group);
    ``start_time`` is psutil's ``create_time`` in seconds since the epoch (None
    where the shim could not read it); ``boot_id`` is the kernel's;
    ``shim_pid`` and ``shim_start_time`` name the shim the same way.
    """

    token: str
    pid: int
    pgid: int
    start_time: float | None
    boot_id: str
    shim_pid: int
    shim_start_time: float | None = None

    def identity(self) -> ProcessIdentity:
        """The server's identity (a missing start time is read now, 0.0 if gone)."""
        started = self.start_time
        if started is None:
            started = identity_of(self.pid).start_time
        return ProcessIdentity(self.pid, self.pgid, started, self.boot_id)


class ExitRecord(msgspec.Struct, frozen=True):
    """``<cwd>/launch/<token>.exit.json``, written by the shim once the server is reaped.

    ``exit_code`` when the server exited, ``signal`` when a signal killed it
    (the other None); ``ended_ns`` is nanoseconds since the Unix epoch. When
    the server could not be started at all, ``error`` says why (in the words
    of :class:`SpawnError`, such as ``no such program (No such file or
    directory)``) and ``pid``, ``exit_code`` and ``signal`` are None.
    """

    token: str
    pid: int | None
    exit_code: int | None
    signal: int | None
    ended_ns: int
    error: str | None = None


def new_token() -> str:
    """A fresh launch token: 32 lowercase hex digits (a UUID4)."""
    return uuid.uuid4().hex


_R = TypeVar("_R", LaunchRecord, ExitRecord)


def check_token(token: str) -> str:
    """``token``, checked to be 1 to 64 letters, digits, ``-`` or ``_`` (it names files).

    Raises:
        ValueError: it is not.
    """
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"launch token {token!r}: 1 to 64 letters, digits, '-' or '_' expected")
    return token


def launch_files(cwd: str, token: str) -> tuple[str, str]:
    """Paths of the (launch, exit) records of launch ``token`` in working directory ``cwd``.

    Raises:
        ValueError: ``token`` is not 1 to 64 letters, digits, ``-`` or ``_``.
    """
    base = os.path.join(cwd, LAUNCH_DIR, check_token(token))
    return base + ".json", base + ".exit.json"


def _read_record(path: str, kind: type[_R], token: str) -> _R | None:
    try:
        with open(path, "rb") as f:
            record = msgspec.json.decode(f.read(), type=kind)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as e:
        _log.warning("ignoring the launch record %s: %s", path, e)
        return None
    return record if record.token == token else None


def read_launch_record(cwd: str, token: str) -> LaunchRecord | None:
    """The launch record of ``token`` in ``cwd``; None if there is none (or it is unreadable).

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    return _read_record(launch_files(cwd, token)[0], LaunchRecord, token)


def read_exit_record(cwd: str, token: str) -> ExitRecord | None:
    """The exit record of ``token`` in ``cwd``; None while there is none (or it is unreadable).

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    return _read_record(launch_files(cwd, token)[1], ExitRecord, token)


def read_exit_status(cwd: str, token: str) -> tuple[int | None, int | None] | None:
    """``(exit_code, signal)`` of launch ``token`` as its shim recorded it.

    Returns:
        None while no exit has been recorded; ``(None, None)`` when the server
        could not be started (see :attr:`ExitRecord.error`); else exactly one
        of the two is an int.

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    record = read_exit_record(cwd, token)
    return None if record is None else (record.exit_code, record.signal)


def await_exit_record(
    cwd: str, token: str, shim: tuple[int, float | None] | None, timeout: float
) -> ExitRecord | None:
    """The exit record, waiting up to ``timeout`` s for the shim to write it;
    stops early once the shim (pid, start time) is seen gone."""
    deadline = time.monotonic() + timeout
    while (record := read_exit_record(cwd, token)) is None:
        if time.monotonic() >= deadline:
            return None
        if shim is not None and not alive(*shim):
            return read_exit_record(cwd, token)
        time.sleep(RECORD_POLL)
    return record


def alive(pid: int, started: float | None) -> bool:
    """``pid`` still runs (not a zombie) as the process started at ``started``
    (unknown: only the pid)."""
    if not REAL.is_live(pid):
        return False
    return started is None or same_start(REAL.start_time(pid), started)


def prepare_launch_dir(cwd: str, token: str) -> None:
    """Create ``<cwd>/launch`` (durably), refuse a used token, prune old launches.

    Raises:
        OSError: the directory could not be created.
        SpawnError: ``token`` has records already.
    """
    directory = os.path.join(cwd, LAUNCH_DIR)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        _fsync_dir(cwd)
    if any(os.path.exists(path) for path in launch_files(cwd, token)):
        raise SpawnError(f"launch token {token} was used before in {cwd}; a launch needs a new one")
    try:
        _prune(cwd, token)
    except OSError as e:
        _log.warning("could not prune old launch records in %s: %s", directory, e)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _prune(cwd: str, current: str) -> None:
    """Delete the records of all but the newest :data:`KEEP_LAUNCHES` other launches
    (never those of a server that is still running)."""
    directory = os.path.join(cwd, LAUNCH_DIR)
    newest: dict[str, float] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            token = entry.name.split(".", 1)[0]
            if token != current and _TOKEN.fullmatch(token):
                with contextlib.suppress(OSError):
                    mtime = entry.stat().st_mtime
                    newest[token] = max(newest.get(token, mtime), mtime)
    for token in sorted(newest, key=newest.__getitem__, reverse=True)[KEEP_LAUNCHES:]:
        launched = read_launch_record(cwd, token)
        if (
            launched is not None
            and read_exit_record(cwd, token) is None
            and find_process(launched.identity()) is not None
        ):
            continue
        for path in launch_files(cwd, token):
            for name in (path, path + ".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
