"""The processes a server started, remembered even after they left its group.

A server's children are in its process group and die with it, unless one calls
``setsid()`` (or ``setpgid()``) and its parent exits: then it belongs to no
group of ours and init is its parent. :class:`Descendants` keeps every
descendant it has seen (pid and start time) so :meth:`Descendants.kill_all` can
reach it anyway; it sees only what was alive and still linked to the server
(or to a known descendant) at one of the :meth:`Descendants.track` calls.

The set is also written to ``server.descendants.json`` in the server's working
directory, so a node that re-attaches after a crash knows what its predecessor
saw. See ``docs/process-supervision.md``. The system is reached through a
:class:`~.system.System` (the machine unless a test passes a fake).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

import msgspec

from .errors import ProcessControlError
from .identity import ProcessIdentity
from .pgroup import KILL_CONFIRM
from .system import REAL, System
from .table import ProcessTable, same_start

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

    def __init__(self, cwd: str, *, resume: bool, system: System = REAL) -> None:
        self._system = system
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
        snapshot) nothing is read from the system; without, the system is asked.
        ``skip``: a pid never remembered (the server, when ``root`` is its shim)."""
        if table is not None:
            self._track_in(root, table, skip)
            return
        with self._lock:
            before = dict(self._known)
            roots = [root.pid] if self._running(root.pid, root.start_time) else []
            for pid, started in before.items():
                if self._running(pid, started):
                    roots.append(pid)
                else:
                    del self._known[pid]
            for pid in roots:
                self._known.update(self._system.children(pid))
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
        through ``System.signal_exact``: a pidfd on the machine) and block until
        none is left.

        Raises:
            ProcessControlError: not permitted, or one outlived SIGKILL for 5 s.
        """
        system = self._system
        deadline = system.monotonic() + KILL_CONFIRM
        while alive := self._alive():
            if system.monotonic() >= deadline:
                raise ProcessControlError(f"descendants {sorted(alive)} outlived SIGKILL")
            for pid, started in alive.items():
                system.signal_exact(pid, started, signal.SIGKILL)
            system.sleep(_SCAN_INTERVAL)

    def _running(self, pid: int, started: float) -> bool:
        """``pid`` is live (not a zombie) and still the process started at ``started``."""
        return self._system.is_live(pid) and same_start(self._system.start_time(pid), started)

    def _alive(self) -> dict[int, float]:
        return {pid: t for pid, t in self.known().items() if self._running(pid, t)}

    def _load(self) -> dict[int, float]:
        try:
            with open(self._path, "rb") as f:
                record = msgspec.json.decode(f.read(), type=_Record)
        except (OSError, msgspec.DecodeError):
            return {}
        return dict(record.known) if record.boot_id == self._system.boot_id() else {}

    def _save(self) -> None:
        temporary = self._path + ".tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(msgspec.json.encode(_Record(self._system.boot_id(), self._known)))
            os.replace(temporary, self._path)
        except OSError as e:
            _log.warning("could not record the descendants in %s: %s", self._path, e)
