"""Spawning, re-attaching and terminating a managed model server: the adapters' OS seam.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``spawn`` builds a
``LaunchSpec`` with a cleared environment and ``OUTPUT_LIMIT`` bytes kept per
stream; ``terminate(grace)`` stops a server and collects its exit; a process is
only ever one this node spawned itself).

A server runs in its own session and process group (its pgid is its pid), so
terminating it reaches every child it started; children that leave the group
are tracked as descendants. Its stdout and stderr go to log files in its
working directory, so it outlives the node that started it, and a later node
can :meth:`AttachedProcess.attach` to it. Both kinds of handle satisfy
:class:`ServerProcess`. See ``docs/process-supervision.md``.

Every OS error is translated here: callers see :class:`SpawnError` and
:class:`ProcessControlError` only.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import msgspec

from .errors import SpawnError
from .limits import ProcLimits, wrap_argv
from .output import STDERR_LOG, STDOUT_LOG, create_logs
from .pgroup import (
    ProcessIdentity,
    boot_id,
    find_process,
    group_members,
    identity_of,
    kill_group,
    terminate_group,
    terminate_identity,
    tree_rss_bytes,
)
from .pidfd import PidHandle
from .watch import OUTPUT_LIMIT, ExitInfo, WatchedProcess

__all__ = [
    "OUTPUT_LIMIT",
    "STDERR_LOG",
    "STDOUT_LOG",
    "AttachedProcess",
    "ExitInfo",
    "LaunchPlan",
    "ManagedProcess",
    "ProcessIdentity",
    "ServerProcess",
    "boot_id",
    "find_process",
    "group_members",
    "kill_group",
    "launch_env",
    "terminate_group",
    "terminate_identity",
    "tree_rss_bytes",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to run: argv, the complete environment, the working directory.

    ``output_limit`` is the number of bytes kept per stream (the tail), in
    memory and in the log files in ``cwd``.
    """

    program: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    output_limit: int = OUTPUT_LIMIT
    limits: ProcLimits | None = None
    run_as: tuple[int, int] | None = None

    def argv(self) -> list[str]:
        """What is executed: the program and its arguments, through the limits
        trampoline when limits or a user are set."""
        argv = [self.program, *self.args]
        if self.limits is None and self.run_as is None:
            return argv
        return wrap_argv(argv, self.limits or ProcLimits(), self.run_as, self.env)


def launch_env(
    passthrough: Sequence[str] = ("HOME", "PATH"), extra: Mapping[str, str] = _EMPTY
) -> dict[str, str]:
    """A cleared environment: only ``passthrough`` names copied from ``os.environ``
    (when set) plus ``extra``; an extra entry wins over a passed-through one."""
    env = {name: os.environ[name] for name in passthrough if name in os.environ}
    env.update(extra)
    return env


class ServerProcess(Protocol):
    """What the node holds for a server process, spawned or re-attached."""

    @property
    def identity(self) -> ProcessIdentity: ...

    def exit_info(self) -> ExitInfo | None: ...

    def wait_exit(self, timeout: float) -> ExitInfo | None: ...

    def output(self) -> tuple[str, str]: ...

    def dropped_bytes(self) -> tuple[int, int]: ...

    def track_descendants(self) -> None: ...

    def kill(self) -> None: ...

    def terminate(self, grace: float) -> ExitInfo: ...


def _popen(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    if not os.path.isdir(plan.cwd):
        raise SpawnError(f"cannot start {plan.program}: working directory {plan.cwd} is missing")
    try:
        out, err = create_logs(plan.cwd)
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: no log files in {plan.cwd}: {e}") from e
    try:
        return subprocess.Popen(
            plan.argv(),
            env=plan.env,
            cwd=plan.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    except FileNotFoundError as e:
        raise SpawnError(f"cannot start {plan.program}: no such program ({e.strerror})") from e
    except PermissionError as e:
        raise SpawnError(f"cannot start {plan.program}: not executable ({e.strerror})") from e
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: {e}") from e
    except ValueError as e:  # a NUL byte in argv or the environment
        raise SpawnError(f"cannot start {plan.program}: {e}") from e
    finally:
        os.close(out)
        os.close(err)


class ManagedProcess(WatchedProcess):
    """A server process this node spawned; create it with :meth:`spawn`."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
    ) -> None:
        self._popen = popen
        # Read before the waiter starts, so the child cannot yet be reaped: the pid is ours.
        identity = identity_of(popen.pid)
        super().__init__(identity, cwd, on_exit, output_limit, resume=False)

    @classmethod
    def spawn(cls, plan: LaunchPlan, on_exit: Callable[[ExitInfo], None]) -> ManagedProcess:
        """Start ``plan`` in a new session and process group; returns at once.

        Its stdout and stderr go to :data:`STDOUT_LOG` and :data:`STDERR_LOG`
        in ``plan.cwd`` (emptied first). ``on_exit`` is called exactly once,
        from a waiter thread, as soon as the process exits (by itself or
        through :meth:`terminate`), with the output it wrote until then. It
        must not block for long; an exception it raises is logged and dropped.

        Raises:
            SpawnError: naming the program (missing, not executable, bad cwd).
        """
        return cls(_popen(plan), plan.cwd, on_exit, plan.output_limit)

    def _await_exit(self) -> tuple[int | None, int | None]:
        code = self._popen.wait()
        return (code, None) if code >= 0 else (None, -code)


class AttachedProcess(WatchedProcess):
    """A server an earlier node process spawned and left running; see :meth:`attach`.

    It is not this process's child, so its exit status cannot be collected:
    its :class:`ExitInfo` has ``exit_code`` and ``signal`` None.
    """

    def __init__(
        self,
        identity: ProcessIdentity,
        handle: PidHandle,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
    ) -> None:
        self._handle = handle
        super().__init__(identity, cwd, on_exit, output_limit, resume=True)

    @classmethod
    def attach(
        cls,
        identity: ProcessIdentity,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int = OUTPUT_LIMIT,
    ) -> AttachedProcess | None:
        """Watch the server ``identity`` names again, if that very process still runs.

        None when :func:`find_process` does not vouch for it (gone, a zombie,
        another boot, or its pid now names another process): nothing is
        signalled then. Otherwise the exit is awaited on a pidfd (psutil where
        there are none), the log files in ``cwd`` are followed from their
        current content, and the descendants an earlier node recorded there
        are remembered. ``on_exit`` is called exactly once, as for
        :meth:`ManagedProcess.spawn`. Returns at once.
        """
        if find_process(identity) is None:
            return None
        handle = PidHandle.open(identity.pid, identity.start_time)
        if handle is None:
            return None
        return cls(identity, handle, cwd, on_exit, output_limit)

    def _await_exit(self) -> tuple[int | None, int | None]:
        try:
            self._handle.wait()
        finally:
            self._handle.close()
        return None, None
