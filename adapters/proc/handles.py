"""The two process handles: a server this node spawned, and one it re-attached to.

A server runs in its own session and process group (its pgid is its pid), so
signals reach every child it started; children that leave the group are
tracked as descendants, and with a cgroup the kernel's list reaches the rest.
Its stdout and stderr go to log files in its working directory, so it
outlives the node that started it, and a later node can
:meth:`AttachedProcess.attach` to it. Both kinds of handle satisfy
:class:`ServerProcess`, which is what the node's executor holds. Source of the
behaviour: ``reference/infer_lifecycle.rs.txt`` (``spawn``; a process is only
ever one this node spawned itself). See ``docs/process-supervision.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .cgroups import InstanceCgroup
from .identity import ProcessIdentity, boot_id, find_process
from .output import OUTPUT_LIMIT
from .pidfd import PidHandle
from .plan import LaunchPlan
from .records import (
    EXIT_RECORD_WAIT,
    LaunchRecord,
    await_exit_record,
    check_token,
    new_token,
    read_exit_record,
    read_launch_record,
)
from .spawn import launch
from .system import Child
from .table import ProcessTable
from .waiter import ExitInfo, WatchedProcess

__all__ = ["AttachedProcess", "ManagedProcess", "ServerProcess"]

_log = logging.getLogger(__name__)


class ServerProcess(Protocol):
    """What the node holds for a server process, spawned or re-attached."""

    @property
    def identity(self) -> ProcessIdentity: ...

    def exit_info(self) -> ExitInfo | None: ...

    def wait_exit(self, timeout: float) -> ExitInfo | None: ...

    def output(self) -> tuple[str, str]: ...

    def dropped_bytes(self) -> tuple[int, int]: ...

    def track_descendants(self, table: ProcessTable | None = None) -> None: ...

    def survivors(self) -> list[int]: ...

    def ended_alone(self) -> ExitInfo | None: ...

    def settle(self, grace: float) -> None: ...

    def sigterm(self) -> None: ...

    def kill(self) -> None: ...

    @property
    def cgroup(self) -> InstanceCgroup | None: ...

    def kill_tree(self) -> ExitInfo: ...


def _shim_identity(pid: int, started: float | None) -> ProcessIdentity | None:
    """The shim as a descendant-tracking root (it leads its own group)."""
    return None if started is None else ProcessIdentity(pid, pid, started, boot_id())


class ManagedProcess(WatchedProcess):
    """A server process this node launched; create it with :meth:`spawn`.

    ``token`` is its launch token, ``shim_pid`` the pid of its shim (this
    process's child, in a session of its own).
    """

    def __init__(  # noqa: PLR0917 -- built by spawn only
        self,
        shim: Child,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
        record: LaunchRecord,
        cgroup: InstanceCgroup | None = None,
    ) -> None:
        self._popen = shim
        self._cwd = cwd
        self.token = record.token
        self.shim_pid = shim.pid
        identity = record.identity()
        # Only the shim can reap the server, so until the shim saw its exit the
        # pid is the server's; a handle refuses a later process with that pid.
        self._server = PidHandle.open(identity.pid, identity.start_time)
        self.oom_kills_at_start = cgroup.oom_kills() if cgroup is not None else None
        super().__init__(
            identity, cwd, on_exit, output_limit, resume=False, cgroup=cgroup,
            shim=_shim_identity(record.shim_pid, record.shim_start_time),
        )  # fmt: skip

    @classmethod
    def spawn(
        cls,
        plan: LaunchPlan,
        on_exit: Callable[[ExitInfo], None],
        token: str | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> ManagedProcess:
        """Start ``plan`` through the exit-status shim; returns once the server runs.

        The shim (this process's child, in a session of its own) starts the
        server in a new session and process group, records
        ``<cwd>/launch/<token>.json`` and reports; this waits up to
        :data:`~.spawn.LAUNCH_REPORT_TIMEOUT` seconds for that. The returned handle's
        ``identity`` is the server's (pid, pgid == pid, start time, boot id).
        Its stdout and stderr go to :data:`~.output.STDOUT_LOG` and :data:`~.output.STDERR_LOG`
        in ``plan.cwd`` (emptied first). ``on_exit`` is called exactly once,
        from a waiter thread, once the server has exited (by itself or through
        :meth:`~.waiter.WatchedProcess.kill_tree`) and the shim has recorded its status, with that
        status and the output written until then. It must not block for long;
        an exception it raises is logged and dropped. The records of all but
        the last :data:`~.records.KEEP_LAUNCHES` other launches in ``plan.cwd`` are
        pruned.

        Args:
            plan: what to run.
            on_exit: called with the exit report.
            token: the launch's token (see :func:`~.records.new_token`), recorded by the
                caller before calling this so that :func:`~.recovery.recover_launch` can
                account for the launch after a crash; it is also put in the
                server's environment as ``INFERVISOR_LAUNCH_TOKEN``. None: a
                fresh one is used for the records only and the server's
                environment is exactly ``plan.env`` (for callers that never
                recover a launch).
            cgroup: the instance's cgroups (``adapters/proc/cgroups.py``): made
                and emptied first; the shim is moved into ``shim`` and the
                server joins ``server`` before ``exec``. None: no cgroups.

        Raises:
            SpawnError: naming the program (missing, not executable, bad cwd,
                a token used before, no report from the shim in time).
            ValueError: ``token`` is not 1 to 64 letters, digits, ``-`` or ``_``.
        """
        inject = token is not None
        token = check_token(new_token() if token is None else token)
        shim, record = launch(plan, token, inject, cgroup)
        return cls(shim, plan.cwd, on_exit, plan.output_limit, record, cgroup)

    def _await_exit(self) -> tuple[int | None, int | None]:
        try:
            self._popen.wait()
            record = read_exit_record(self._cwd, self.token)
            if record is None and self._server is not None:
                # The shim was killed: the server may still run, unwatched by it.
                _log.warning(
                    "shim %d ended with no exit record; waiting for the server", self.shim_pid
                )
                self._server.wait()
                record = read_exit_record(self._cwd, self.token)
        finally:
            if self._server is not None:
                self._server.close()
        if record is None or record.pid != self.identity.pid:
            return None, None
        return record.exit_code, record.signal


class AttachedProcess(WatchedProcess):
    """A server an earlier node process spawned and left running; see :meth:`attach`.

    It is not this process's child: its exit status is the one its shim
    recorded (given the launch ``token``), else unknown (``exit_code`` and
    ``signal`` None).
    """

    def __init__(
        self,
        identity: ProcessIdentity,
        handle: PidHandle,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
        *,
        token: str | None = None,
        shim: tuple[int, float | None] | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> None:
        self._handle = handle
        self._cwd = cwd
        self.token = token
        self._shim = shim
        super().__init__(
            identity, cwd, on_exit, output_limit, resume=True, cgroup=cgroup,
            shim=None if shim is None else _shim_identity(*shim),
        )  # fmt: skip

    @classmethod
    def attach(
        cls,
        identity: ProcessIdentity,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int = OUTPUT_LIMIT,
        *,
        token: str | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> AttachedProcess | None:
        """Watch the server ``identity`` names again, if that very process still runs.

        None when :func:`~.identity.find_process` does not vouch for it (gone, a zombie,
        another boot, or its pid now names another process): nothing is
        signalled then. Otherwise the exit is awaited on a pidfd (psutil where
        there are none), the log files in ``cwd`` are followed from their
        current content, and the descendants an earlier node recorded there
        are remembered. ``on_exit`` is called exactly once, as for
        :meth:`ManagedProcess.spawn`. Returns at once.

        Args:
            identity: the server, as recorded when it was spawned.
            cwd: its working directory (log files, records).
            on_exit: called with the exit report.
            output_limit: bytes of each stream kept.
            token: its launch token. When given and its launch record names
                this very pid, the exit report carries the status from
                ``<cwd>/launch/<token>.exit.json`` (waiting up to
                :data:`EXIT_RECORD_WAIT` seconds for the shim to write it after
                the server is gone). Otherwise, or without the record, the
                status is None as it cannot be collected.
            cgroup: the instance's cgroups, if it has them.

        Raises:
            ValueError: ``token`` is malformed (see :func:`~.records.launch_files`).
        """
        shim: tuple[int, float | None] | None = None
        if token is not None:
            launched = read_launch_record(cwd, token)
            if launched is None or launched.pid != identity.pid:
                _log.warning(
                    "launch %s records no pid %d: exit status unknown", token, identity.pid
                )
                token = None
            else:
                shim = (launched.shim_pid, launched.shim_start_time)
        if find_process(identity) is None:
            return None
        handle = PidHandle.open(identity.pid, identity.start_time)
        if handle is None:
            return None
        return cls(
            identity, handle, cwd, on_exit, output_limit, token=token, shim=shim, cgroup=cgroup
        )

    def _await_exit(self) -> tuple[int | None, int | None]:
        try:
            self._handle.wait()
        finally:
            self._handle.close()
        if self.token is None:
            return None, None
        record = await_exit_record(self._cwd, self.token, self._shim, EXIT_RECORD_WAIT)
        if record is None or record.pid != self.identity.pid:
            return None, None
        return record.exit_code, record.signal
