"""The processes a server started, remembered even after they left its group.

A server's children are in its process group and die with it, unless one calls
``setsid()`` (or ``setpgid()``) and its parent exits: then it belongs to no
group of ours and init is its parent. :class:`Descendants` keeps every
descendant it has seen (pid and start time) so :meth:`Descendants.kill_all` can
reach it anyway; it sees only what was alive and still linked to the server
(or to a known descendant) at one of the :meth:`Descendants.track` calls.

The set is also written to ``server.descendants.json`` in the server's working
directory, so a node that re-attaches after a crash knows what its predecessor
saw. See ``docs/process-supervision.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import msgspec
import psutil

from .errors import ProcessControlError
from .pgroup import KILL_CONFIRM, ProcessIdentity, boot_id, find_process
from .pidfd import PidHandle
from .proc_table import ProcessTable

__all__ = ["RECORD", "Descendants"]

RECORD = "server.descendants.json"
_SCAN_INTERVAL = 0.02  # s between checks while confirming that killed descendants are gone

_log = logging.getLogger(__name__)


class _Record(msgspec.Struct, frozen=True):
    boot_id: str
    known: dict[int, float]


class Descendants:
    """Descendants of one server, as pid -> start time; thread-safe.

    ``cwd`` is where the record is kept; ``resume`` loads the record a previous
    node left (if it was written during this boot), otherwise it is discarded.
    """

    def __init__(self, cwd: str, *, resume: bool) -> None:
        self._path = os.path.join(cwd, RECORD)
        self._lock = threading.Lock()
        self._known: dict[int, float] = self._load() if resume else {}
        if not resume:
            with contextlib.suppress(OSError):
                os.unlink(self._path)

    def known(self) -> dict[int, float]:
        """The descendants remembered and not yet seen gone."""
        with self._lock:
            return dict(self._known)

    def track(
        self, root: ProcessIdentity, table: ProcessTable | None = None, *, skip: int | None = None
    ) -> None:
        """Add the live descendants of ``root`` and of every known descendant;
        forget known ones that are gone. With ``table`` (the reconcile tick's
        snapshot) nothing is read from the system; without, psutil is asked.
        ``skip``: a pid never remembered (the server, when ``root`` is its shim)."""
        if table is not None:
            self._track_in(root, table, skip)
            return
        with self._lock:
            before = dict(self._known)
            roots = [p for p in (find_process(root),) if p is not None]
            for pid, started in before.items():
                proc = find_process(ProcessIdentity(pid, 0, started, boot_id()))
                if proc is None:
                    del self._known[pid]
                else:
                    roots.append(proc)
            for proc in roots:
                self._known.update(_children(proc))
            self._known.pop(root.pid, None)
            self._known.pop(skip or root.pid, None)
            if self._known != before:
                self._save()

    def _track_in(self, root: ProcessIdentity, table: ProcessTable, skip: int | None) -> None:
        with self._lock:
            before = dict(self._known)
            roots = [root.pid] if table.is_alive(root.pid, root.start_time) else []
            for pid, started in before.items():
                if table.is_alive(pid, started):
                    roots.append(pid)
                else:
                    del self._known[pid]
            for pid in roots:
                self._known.update(table.descendants(pid))
            self._known.pop(root.pid, None)
            self._known.pop(skip or root.pid, None)
            if self._known != before:
                self._save()

    def kill_all(self) -> None:
        """SIGKILL every known descendant still alive (each one identity-checked
        through a :class:`PidHandle`) and block until none is left.

        Raises:
            ProcessControlError: not permitted, or one outlived SIGKILL for 5 s.
        """
        deadline = time.monotonic() + KILL_CONFIRM
        while alive := self._alive():
            if time.monotonic() >= deadline:
                raise ProcessControlError(f"descendants {sorted(alive)} outlived SIGKILL")
            for pid, started in alive.items():
                _kill(pid, started)
            time.sleep(_SCAN_INTERVAL)

    def _alive(self) -> dict[int, float]:
        me = boot_id()
        return {
            pid: started
            for pid, started in self.known().items()
            if find_process(ProcessIdentity(pid, 0, started, me)) is not None
        }

    def _load(self) -> dict[int, float]:
        try:
            with open(self._path, "rb") as f:
                record = msgspec.json.decode(f.read(), type=_Record)
        except (OSError, msgspec.DecodeError):
            return {}
        return dict(record.known) if record.boot_id == boot_id() else {}

    def _save(self) -> None:
        temporary = self._path + ".tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(msgspec.json.encode(_Record(boot_id(), self._known)))
            os.replace(temporary, self._path)
        except OSError as e:
            _log.warning("could not record the descendants in %s: %s", self._path, e)


def _children(proc: psutil.Process) -> dict[int, float]:
    found: dict[int, float] = {}
    try:
        kids = proc.children(recursive=True)
    except psutil.Error:
        return found
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            found[kid.pid] = kid.create_time()
    return found


def _kill(pid: int, started: float) -> None:
    handle = PidHandle.open(pid, started)
    if handle is None:
        return
    try:
        handle.send(signal.SIGKILL)
    finally:
        handle.close()
