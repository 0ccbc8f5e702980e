"""The waiter: what a spawned and a re-attached server process share (output
tails, the exit report, descendant tracking, signals to the tree).

Threads per process: two :class:`~.output.LogReader` follow the log files, one
waiter blocks until the server exits (how is up to the subclass: ``wait()``
on our own child, a pidfd on an adopted one), lets the readers finish, and
reports the exit once. :mod:`.handles` holds the two concrete classes; the
signals go to a :class:`~.tree.ServerTree`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import msgspec

from .cgroups import InstanceCgroup
from .descendants import Descendants
from .errors import ProcessControlError
from .identity import ProcessIdentity, find_process
from .output import LogReader, Tail, exit_tail, log_paths
from .pgroup import KILL_CONFIRM
from .system import REAL
from .table import ProcessTable
from .tree import ServerTree

__all__ = ["ExitInfo", "WatchedProcess"]

_READER_DRAIN = 0.5  # s an exit report waits for the readers to reach end of output
_FALLBACK_POLL = 0.5  # s between identity checks should waiting itself fail

_log = logging.getLogger(__name__)


class ExitInfo(msgspec.Struct, frozen=True):
    """How a process ended: ``exit_code`` when it exited, ``signal`` when killed by one.

    Both are None when the status cannot be known: a re-attached server is not
    this process's child, so nobody here can collect it.

    ``output_tail`` holds the last 4096 bytes of its stdout followed by its
    stderr (stderr last, so an error message survives), decoded as UTF-8 with
    undecodable bytes replaced.
    """

    pid: int
    exit_code: int | None
    signal: int | None
    output_tail: str
    #: The kernel's OOM killer killed in the server's cgroup during this launch.
    oom_killed: bool = False


class WatchedProcess:
    """Base of :class:`~.handles.ManagedProcess` and :class:`~.handles.AttachedProcess`.

    A subclass sets what its :meth:`_await_exit` needs, then calls
    ``super().__init__``, which starts the threads. ``cgroup``: the
    instance's cgroups (None: process groups and descendant tracking only);
    ``shim``: the server's exit-status shim, whose orphans (re-parented to it,
    a subreaper) are tracked as descendants when there is no cgroup.
    """

    identity: ProcessIdentity
    cgroup: InstanceCgroup | None

    def __init__(
        self,
        identity: ProcessIdentity,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
        *,
        resume: bool,
        cgroup: InstanceCgroup | None = None,
        shim: ProcessIdentity | None = None,
    ) -> None:
        self.identity = identity
        self.cgroup = cgroup
        self._shim_identity = shim
        self._on_exit = on_exit
        self._out, self._err = Tail(output_limit), Tail(output_limit)
        self._stop_reading = threading.Event()
        self._exited = threading.Event()
        self._info: ExitInfo | None = None
        self._at_exit: dict[int, float] | None = None  # the group when the exit was seen
        self._terminating = threading.Lock()
        self._descendants = Descendants(cwd, resume=resume)
        self._tree = ServerTree(
            REAL, identity.pgid, cgroup, self._descendants, lambda: self._at_exit
        )
        self._logs = [
            LogReader(path, tail, output_limit, self._stop_reading, resume=resume)
            for path, tail in zip(log_paths(cwd), (self._out, self._err), strict=True)
        ]
        self._readers = [self._thread(log.run) for log in self._logs]
        self._thread(self._wait_and_report)

    def _thread(self, target: Callable[[], None]) -> threading.Thread:
        name = f"{target.__name__.strip('_')}-{self.identity.pid}"
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        return t

    def _await_exit(self) -> tuple[int | None, int | None]:
        """Block until the server exits; (exit code, signal) as far as known."""
        raise NotImplementedError

    def _wait_and_report(self) -> None:
        try:
            code, sig = self._await_exit()
        except Exception:  # noqa: BLE001 -- a dead waiter would leave the server unwatched
            _log.exception("waiting for pid %d failed; polling instead", self.identity.pid)
            while find_process(self.identity) is not None:
                time.sleep(_FALLBACK_POLL)
            code, sig = None, None
        self._at_exit = REAL.group_members(self.identity.pgid)
        # What the server wrote is read first; a descendant that keeps writing
        # delays the report by at most _READER_DRAIN seconds. Readers that have
        # read everything already are not waited for (two thread wake-ups saved
        # on the way from an exit to its event).
        self._stop_reading.set()
        if not all(log.caught_up() for log in self._logs):
            drained_by = time.monotonic() + _READER_DRAIN
            for reader in self._readers:
                reader.join(max(drained_by - time.monotonic(), 0.0))
        oom = bool(self.cgroup.oom_kills()) if self.cgroup is not None else False
        tail = exit_tail(self._out, self._err)
        self._info = ExitInfo(self.identity.pid, code, sig, tail, oom_killed=oom)
        self._exited.set()
        try:
            self._on_exit(self._info)
        except Exception:  # noqa: BLE001 -- a caller's bug must not go unseen or kill the waiter
            _log.exception("on_exit callback of pid %d failed", self.identity.pid)

    def exit_info(self) -> ExitInfo | None:
        """How the process ended, or None while it runs (or is being reported)."""
        return self._info

    def wait_exit(self, timeout: float) -> ExitInfo | None:
        """Block up to ``timeout`` seconds for the exit; None if still running."""
        self._exited.wait(max(timeout, 0.0))
        return self._info

    def output(self) -> tuple[str, str]:
        """The kept tails of (stdout, stderr), decoded with replacement."""
        return self._out.text(), self._err.text()

    def dropped_bytes(self) -> tuple[int, int]:
        """Bytes of (stdout, stderr) let go to keep the tails within the limit."""
        return self._out.dropped, self._err.dropped

    def track_descendants(self, table: ProcessTable | None = None) -> None:
        """Remember the server's live descendants (pid and start time), so that
        :meth:`terminate` reaches those that leave its process group. Call it on
        every reconcile tick with the tick's :class:`ProcessTable` (then nothing
        is read from the system); without one it scans the process table."""
        self._descendants.track(self.identity, table)
        # The shim's orphans too, with a cgroup as without: a server running as
        # root can move a child out of its cgroup, but not out from under the
        # shim, which is its subreaper.
        if self._shim_identity is not None:
            self._descendants.track(self._shim_identity, table, skip=self.identity.pid)

    def descendants(self) -> dict[int, float]:
        """The descendants remembered so far (pid -> start time) and not seen gone."""
        return self._descendants.known()

    def ended_alone(self) -> ExitInfo | None:
        """How the server ended, if nothing of its tree outlived it: the exit is
        reported, its group had no member left when the exit was seen, no
        descendant is remembered and its cgroup (if any) holds nobody. Then there
        is nothing to wait for, reap or kill; None otherwise (or while it runs).
        Reads no process table (one cgroup file with a cgroup)."""
        info = self._info
        if info is None or self._at_exit or self._descendants.known():
            return None
        if self.cgroup is not None and self.cgroup.server_members():
            return None
        return info

    def survivors(self) -> list[int]:
        """Live members of the server's process group once its leader has exited
        (those that outlived it; ``[]`` before the exit is seen). Scans the
        process table."""
        return self._tree.survivors(self.identity.pid)

    def settle(self, grace: float) -> None:
        """Wait up to ``grace`` seconds, signalling nothing, for what is left of
        the server's tree (its group, its cgroup) to end by itself: a stop gives
        its grace to the children too, after the leader has exited."""
        self._tree.settle(grace)

    def sigterm(self) -> None:
        """SIGTERM the server's process group and, with a cgroup, every other
        member of it; returns at once (see :meth:`~.tree.ServerTree.sigterm`).

        Raises:
            ProcessControlError: the group could not be signalled.
        """
        self._tree.sigterm()

    def kill(self) -> None:
        """SIGKILL the process group (and the cgroup) now; returns at once.

        Raises:
            ProcessControlError: the group could not be signalled.
        """
        self._tree.kill()

    def kill_tree(self) -> ExitInfo:
        """SIGKILL the server and everything it started; return how it ended (blocking).

        Tracks the descendants once more, then kills the cgroup until it is
        empty, the group until it has no member, and every tracked descendant
        (see :meth:`~.tree.ServerTree.kill_all`), and waits for the exit report.
        No SIGTERM and no grace: a stop's SIGTERM is :meth:`sigterm`, its grace
        the decision core's ``kill`` timer. Idempotent, and safe once the
        process has exited by itself; concurrent calls are serialised.

        Raises:
            ProcessControlError: something could not be signalled or outlived SIGKILL.
        """
        with self._terminating:
            self.track_descendants()
            self._tree.kill_all()
            info = self.wait_exit(KILL_CONFIRM)
        if info is None:
            raise ProcessControlError(f"pid {self.identity.pid} did not exit after SIGKILL")
        return info
