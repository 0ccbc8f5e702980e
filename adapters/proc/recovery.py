"""Boot recovery: accounting for a launch the node decided before it stopped.

A launch's token is recorded in the chain before the launch runs, so after a
crash the next node asks :func:`recover_launch` what became of it: adopted
(the server still runs), ended (the shim recorded how), or never started.
See ``docs/process-supervision.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeAlias

import msgspec

from .cgroups import InstanceCgroup
from .handles import AttachedProcess
from .identity import ProcessIdentity, boot_id
from .output import OUTPUT_LIMIT
from .records import (
    RECORD_POLL,
    ExitRecord,
    LaunchRecord,
    alive,
    await_exit_record,
    read_exit_record,
    read_launch_record,
)
from .spawn import LAUNCH_REPORT_TIMEOUT, carriers, kill_carriers
from .system import REAL
from .waiter import ExitInfo

__all__ = [
    "LaunchEnded",
    "LaunchNeverStarted",
    "LaunchRecovery",
    "LaunchRunning",
    "recover_launch",
]


class LaunchRunning(msgspec.Struct, frozen=True, tag="running"):
    """The launch record exists and that very server still runs: it is adopted.

    ``process`` watches it (attached with the token, so its exit status will
    be known); ``identity`` is the server's.
    """

    process: AttachedProcess
    identity: ProcessIdentity


class LaunchEnded(msgspec.Struct, frozen=True, tag="ended"):
    """The server ran and ended while no node watched it (or could not start).

    ``exit_code``/``signal`` are what its shim recorded (exactly one set when
    known). ``error`` is set instead when the server could not be started
    (the words of a :class:`~.errors.SpawnError`). ``pid`` is the server's, None if it
    never started; ``ended_ns`` nanoseconds since the Unix epoch. ``reason``
    is set when the status is unknown: why (the shim was killed, or the
    machine rebooted).
    """

    exit_code: int | None
    signal: int | None
    error: str | None = None
    pid: int | None = None
    ended_ns: int | None = None
    reason: str | None = None


class LaunchNeverStarted(msgspec.Struct, frozen=True, tag="never_started"):
    """No record of the launch and no process carries its token (or those that
    did were killed, having recorded nothing in time); ``reason`` says which."""

    reason: str


#: What :func:`recover_launch` found.
LaunchRecovery: TypeAlias = LaunchRunning | LaunchEnded | LaunchNeverStarted


def _ended(record: ExitRecord) -> LaunchEnded:
    return LaunchEnded(
        exit_code=record.exit_code,
        signal=record.signal,
        error=record.error,
        pid=record.pid,
        ended_ns=record.ended_ns,
    )


def recover_launch(
    cwd: str,
    token: str,
    on_exit: Callable[[ExitInfo], None],
    output_limit: int = OUTPUT_LIMIT,
    *,
    wait: float = LAUNCH_REPORT_TIMEOUT,
    cgroup: InstanceCgroup | None = None,
) -> LaunchRecovery:
    """Account at boot for launch ``token`` in ``cwd``, decided before the node stopped.

    - The exit record exists: :class:`LaunchEnded` with the recorded status.
    - The launch record exists and that very server runs: :class:`LaunchRunning`,
      attached (as :meth:`AttachedProcess.attach` with the token; ``on_exit``
      and ``output_limit`` as there). If it is gone, its shim is given up to
      ``wait`` seconds to record the exit; without it, :class:`LaunchEnded`
      with unknown status and a ``reason``.
    - Neither: the process table is scanned once for processes carrying the
      token. None: :class:`LaunchNeverStarted`. Some (a shim or server whose
      record is late): up to ``wait`` seconds for a record, handled as above;
      if none comes, their process groups are killed and
      :class:`LaunchNeverStarted` says so. With ``cgroup``, its members count
      as carriers too (the kernel's list: a process whose environment could
      not be read is still found), and it is emptied when no record comes.

    Args:
        cwd: the server's working directory.
        token: the launch's token, as given to :meth:`~.handles.ManagedProcess.spawn`.
        on_exit: the exit callback for an adopted server.
        output_limit: bytes of each stream kept for an adopted server.
        wait: seconds to wait for a record a live shim is about to write.
        cgroup: the instance's cgroups, if it has them.

    Raises:
        ProcessControlError: a process carrying the token could not be killed.
        ValueError: ``token`` is malformed (see :func:`~.records.launch_files`).
    """
    if (ended := read_exit_record(cwd, token)) is not None:
        return _ended(ended)
    launched = read_launch_record(cwd, token)
    if launched is None:
        marked = {**carriers(token), **_members_of(cgroup)}
        if not marked:
            return LaunchNeverStarted(
                reason=f"no record of launch {token} and no process carries it"
            )
        found = _await_any_record(cwd, token, marked, wait)
        if isinstance(found, ExitRecord):
            return _ended(found)
        if found is None:
            _end_launch(token, marked, cgroup)
            return LaunchNeverStarted(
                reason=f"pids {sorted(marked)} carried launch {token} but recorded no launch "
                f"within {wait:g} s; their process groups were killed"
            )
        launched = found
    return _adopt(
        cwd=cwd, token=token, launched=launched, on_exit=on_exit,
        output_limit=output_limit, wait=wait, cgroup=cgroup,
    )  # fmt: skip


_RESCANS = 3  # scans for carriers after a kill (a server forked during the first)


def _end_launch(token: str, marked: Mapping[int, float], cgroup: InstanceCgroup | None) -> None:
    """Kill a launch that recorded nothing in time: its carriers, then whatever
    carries the token now (a shim slow to record may have forked its server
    after the first scan: issue 17's unclaimed server), then its cgroups, the
    kernel's list, which misses nothing.

    Raises:
        ProcessControlError: something could not be killed.
    """
    kill_carriers(marked)
    for _ in range(_RESCANS):
        more = carriers(token)
        if not more:
            break
        kill_carriers(more)
    if cgroup is not None:
        cgroup.kill(everything=True)


def _members_of(cgroup: InstanceCgroup | None) -> dict[int, float]:
    """The live members of an instance's cgroups: pid -> start time."""
    found: dict[int, float] = {}
    for pid in cgroup.members() if cgroup is not None else ():
        started = REAL.start_time(pid)
        if started is not None:
            found[pid] = started
    return found


def _await_any_record(
    cwd: str, token: str, marked: Mapping[int, float], wait: float
) -> LaunchRecord | ExitRecord | None:
    """The first record of ``token`` to appear within ``wait`` s; None if none did
    (stops early once every carrier is gone)."""
    deadline = REAL.monotonic() + wait
    while True:
        if (ended := read_exit_record(cwd, token)) is not None:
            return ended
        if (launched := read_launch_record(cwd, token)) is not None:
            return launched
        if REAL.monotonic() >= deadline or not any(alive(*c) for c in marked.items()):
            return read_exit_record(cwd, token) or read_launch_record(cwd, token)
        REAL.sleep(RECORD_POLL)


def _adopt(
    *,
    cwd: str,
    token: str,
    launched: LaunchRecord,
    on_exit: Callable[[ExitInfo], None],
    output_limit: int,
    wait: float,
    cgroup: InstanceCgroup | None,
) -> LaunchRecovery:
    if launched.boot_id != boot_id():
        why = "the machine restarted since the launch; no exit status was recorded"
        return LaunchEnded(exit_code=None, signal=None, pid=launched.pid, reason=why)
    identity = launched.identity()
    proc = AttachedProcess.attach(identity, cwd, on_exit, output_limit, token=token, cgroup=cgroup)
    if proc is not None:
        return LaunchRunning(process=proc, identity=identity)
    shim = (launched.shim_pid, launched.shim_start_time)
    if (ended := await_exit_record(cwd, token, shim, wait)) is not None:
        return _ended(ended)
    why = f"pid {launched.pid} is gone and its shim recorded no exit status (was it killed?)"
    return LaunchEnded(exit_code=None, signal=None, pid=launched.pid, reason=why)
