"""The operating-system seam: every OS call process supervision makes, in one place.

As supervisor keeps its OS calls in ``options.py`` (with the recording fake
``DummyOptions`` beside it) and httpcore its network backends, process
supervision reaches the system only through a :class:`System`: the clock it
waits by, spawning, signals, the process table, and the cgroup filesystem.
:data:`REAL` is the machine; :class:`~.fake.FakeSystem` (``adapters/proc/fake.py``)
is an in-memory one with processes a test makes exit, ignore SIGTERM or fork
children, and cgroups, so the termination escalation (SIGTERM, grace,
``cgroup.kill``/SIGKILL) runs without real waits.

Conventions shared by both implementations:

- a process is named by pid and start time (seconds since the epoch, psutil's
  ``create_time``); two start times within ``table.START_SLACK`` seconds are the
  same process (``table.same_start``);
- "live" excludes zombies: a zombie runs nothing, though it keeps its pid;
- :meth:`System.kill` and :meth:`System.killpg` raise ``ProcessLookupError``
  (no such process or group) and ``PermissionError`` as ``os.kill`` does; the
  cgroup calls raise ``OSError``. Callers translate them into
  :class:`~.errors.ProcessControlError` or :class:`~.errors.SpawnError`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import psutil

from . import identity
from .pidfd import PidHandle
from .table import ProcessEntry, ProcessTable, read_proc_table

__all__ = ["REAL", "Child", "RealSystem", "Spawn", "System"]

# A zombie ("Z") stays listed until its parent reaps it, and one being torn
# down shows "X": neither runs anything.
_DEAD = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@dataclass(frozen=True)
class Spawn:
    """What to start: ``argv`` with exactly ``env`` in ``cwd``; its stderr goes
    to descriptor ``stderr`` (None: this process's), and ``pass_fds`` stay open
    in it."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    stderr: int | None = None
    pass_fds: Sequence[int] = ()


class Child(Protocol):
    """A process this node spawned (``subprocess.Popen`` in the real system)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class System(Protocol):
    """What process supervision asks of the operating system."""

    # ---------------------------------------------------------------- clock
    def monotonic(self) -> float:
        """Seconds on a clock that never steps back (waits and deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (the fake advances its clock instead)."""
        ...

    # ---------------------------------------------------------------- spawn
    def spawn(self, what: Spawn) -> Child:
        """Start ``what.argv`` in a new session (its own process group), stdin
        and stdout pipes to this process (see :class:`Spawn`).

        Raises:
            OSError: it could not be started.
        """
        ...

    # ---------------------------------------------------------------- signals
    def own_group(self) -> int:
        """This process's own process group (never to be signalled)."""
        ...

    def kill(self, pid: int, sig: int) -> None:
        """Send ``sig`` to ``pid`` (``os.kill``)."""
        ...

    def killpg(self, pgid: int, sig: int) -> None:
        """Send ``sig`` to process group ``pgid`` (``os.killpg``)."""
        ...

    def signal_exact(self, pid: int, start_time: float, sig: int) -> bool:
        """Send ``sig`` to ``pid`` only if it is still the process started at
        ``start_time`` (a pidfd where there are pidfds); False if it is gone.

        Raises:
            ProcessControlError: not permitted.
        """
        ...

    # ---------------------------------------------------------------- process table
    def boot_id(self) -> str:
        """The kernel's boot id, ``""`` where the system has none."""
        ...

    def start_time(self, pid: int) -> float | None:
        """When ``pid`` started (zombies included); None when there is no such pid."""
        ...

    def is_live(self, pid: int) -> bool:
        """``pid`` exists and is not a zombie."""
        ...

    def pgid(self, pid: int) -> int | None:
        """The process group of ``pid``; None when it is gone."""
        ...

    def group_members(self, pgid: int) -> dict[int, float]:
        """Live members of process group ``pgid``: pid -> start time (one scan)."""
        ...

    def children(self, pid: int) -> dict[int, float]:
        """Every live descendant of ``pid`` (not ``pid``): pid -> start time."""
        ...

    def carriers(self, name: str, value: str) -> dict[int, float]:
        """Live processes (not this one) whose environment holds ``name=value``."""
        ...

    def rss_bytes(self, pid: int) -> int | None:
        """Resident memory of ``pid`` in bytes; None when it is gone."""
        ...

    def table(self) -> ProcessTable:
        """One read of the whole process table."""
        ...

    # ---------------------------------------------------------------- cgroup filesystem
    def cg_isdir(self, path: str) -> bool:
        """Whether the cgroup directory ``path`` exists."""
        ...

    def cg_exists(self, path: str) -> bool:
        """Whether the cgroup file or directory ``path`` exists."""
        ...

    def cg_make(self, path: str) -> None:
        """Create cgroup ``path`` and its missing parents (idempotent). Raises OSError."""
        ...

    def cg_remove(self, path: str) -> None:
        """Remove the (empty) cgroup ``path``. Raises OSError (busy, missing)."""
        ...

    def cg_walk(self, top: str) -> list[str]:
        """``top`` and every cgroup below it, deepest first (an rmdir order)."""
        ...

    def cg_list(self, path: str) -> list[str]:
        """Names of the cgroups directly below ``path``."""
        ...

    def cg_read(self, path: str) -> str | None:
        """The text of a cgroup file; None when it cannot be read."""
        ...

    def cg_write(self, path: str, value: str) -> None:
        """Write ``value`` to a cgroup file (one ``write``). Raises OSError."""
        ...


class RealSystem:
    """The machine: ``os``, ``psutil``, pidfds and the cgroup filesystem."""

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def spawn(self, what: Spawn) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                list(what.argv),
                env=dict(what.env),
                cwd=what.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=what.stderr,
                pass_fds=tuple(what.pass_fds),
                start_new_session=True,
            )
        except subprocess.SubprocessError as e:
            raise OSError(str(e)) from e

    def own_group(self) -> int:
        return os.getpgrp()

    def kill(self, pid: int, sig: int) -> None:
        os.kill(pid, sig)

    def killpg(self, pgid: int, sig: int) -> None:
        os.killpg(pgid, sig)

    def signal_exact(self, pid: int, start_time: float, sig: int) -> bool:
        handle = PidHandle.open(pid, start_time)
        if handle is None:
            return False
        try:
            return handle.send(sig)
        finally:
            handle.close()

    def boot_id(self) -> str:
        return identity.boot_id()

    def start_time(self, pid: int) -> float | None:
        try:
            return float(psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    def is_live(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).status() not in _DEAD
        except psutil.Error:
            return False

    def pgid(self, pid: int) -> int | None:
        try:
            return os.getpgid(pid)
        except OSError:
            return None

    def group_members(self, pgid: int) -> dict[int, float]:
        members: dict[int, float] = {}
        if pgid > 1:
            try:
                os.killpg(pgid, 0)  # signal 0 delivers nothing: is anything in the group?
            except ProcessLookupError:
                return members  # nothing, zombies included: no process table to scan
            except OSError:
                pass  # not ours to signal: the scan says
        for pid in psutil.pids():
            try:
                if os.getpgid(pid) != pgid:
                    continue
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    members[pid] = proc.create_time()
            except (OSError, psutil.Error):
                continue  # gone (or not ours to see) in the meantime
        return members

    def children(self, pid: int) -> dict[int, float]:
        found: dict[int, float] = {}
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return found
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                if kid.status() != psutil.STATUS_ZOMBIE:
                    found[kid.pid] = kid.create_time()
        return found

    def carriers(self, name: str, value: str) -> dict[int, float]:
        found: dict[int, float] = {}
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(name) == value:
                    found[proc.pid] = proc.create_time()
            except (psutil.Error, OSError):
                continue  # gone, a zombie, or not ours to read
        return found

    def rss_bytes(self, pid: int) -> int | None:
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None

    def table(self) -> ProcessTable:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return read_proc_table()
        return _psutil_table()  # no /proc to read: psutil's portable way

    def cg_isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def cg_exists(self, path: str) -> bool:
        return os.path.exists(path)

    def cg_make(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def cg_remove(self, path: str) -> None:
        os.rmdir(path)

    def cg_walk(self, top: str) -> list[str]:
        return [dirpath for dirpath, _, _ in os.walk(top, topdown=False)]

    def cg_list(self, path: str) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(path) if e.is_dir())
        except OSError:
            return []

    def cg_read(self, path: str) -> str | None:
        try:
            with open(path, encoding="ascii") as f:
                return f.read()
        except OSError:
            return None

    def cg_write(self, path: str, value: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


def _psutil_table() -> ProcessTable:
    """The process table through psutil, where ``/proc`` cannot be read."""
    entries: dict[int, ProcessEntry] = {}
    for proc in psutil.process_iter(["ppid", "create_time", "memory_info", "status"]):
        info = proc.info
        memory = info.get("memory_info")
        ppid, started = info.get("ppid"), info.get("create_time")
        if ppid is None or started is None or info.get("status") == psutil.STATUS_ZOMBIE:
            continue  # gone, not readable while we looked, or dead
        entries[proc.pid] = ProcessEntry(ppid, started, memory.rss if memory else 0)
    return ProcessTable(entries)


#: The machine this node runs on.
REAL: System = RealSystem()
