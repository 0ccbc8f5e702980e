"""Process groups and process identity: signalling, scanning, recognising.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``terminate``
of a server's process; a server is only ever one this node spawned). A managed
server leads its own process group, so these work on the group: every child it
started is reached. :mod:`.process` re-exports the public names.

A process group id is the leader's pid, and Linux hands out no pid that is
still some group's id, so a group id names the same group as long as one of
its members lives. Once the leader has exited, a group is recognised as the
leader's only while it still holds one of the processes (pid and start time)
that were in it when the exit was seen (``at_exit``): a group that emptied and
whose id came back with a new process would hold none of them. See
``docs/process-supervision.md``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping

import msgspec
import psutil

from .errors import ProcessControlError

__all__ = [
    "ProcessIdentity",
    "boot_id",
    "find_process",
    "group_members",
    "identity_of",
    "kill_group",
    "members_of",
    "same_process",
    "signal_group",
    "terminate_group",
    "terminate_identity",
    "tree_rss_bytes",
]

KILL_CONFIRM = 5.0  # s a group is given to vanish after SIGKILL
_SCAN_INTERVAL = 0.02  # s between process-table scans while waiting on a group
# /proc/stat's btime is whole seconds and follows wall-clock steps, so the same
# process can read back with a start time one second off after a clock change.
_START_SLACK = 1.0
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


class ProcessIdentity(msgspec.Struct, frozen=True):
    """Enough to recognise a process again after a node restart.

    ``start_time`` is psutil's ``create_time`` (seconds since the epoch);
    ``boot_id`` is the kernel's boot id, ``""`` where the system has none.
    """

    pid: int
    pgid: int
    start_time: float
    boot_id: str


def boot_id() -> str:
    """The kernel's boot id, ``""`` where the system has none."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def identity_of(pid: int) -> ProcessIdentity:
    """The identity of ``pid``, which must lead its own group (a spawned server).

    Read it before the process can be reaped; a start time that cannot be read
    is recorded as 0.0, which :func:`find_process` never matches.
    """
    try:
        started = float(psutil.Process(pid).create_time())
    except psutil.Error:
        started = 0.0
    return ProcessIdentity(pid, pid, started, boot_id())


def members_of(pgid: int) -> dict[int, float]:
    """Live members of process group ``pgid`` (zombies excluded): pid -> start time."""
    members: dict[int, float] = {}
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


def group_members(pgid: int, at_exit: Mapping[int, float] | None = None) -> list[int]:
    """Live pids whose process group is ``pgid`` (zombies excluded).

    With ``at_exit`` (the members seen when the leader's exit was observed,
    pid -> start time) they are returned only while one of those very
    processes is among them, which proves the id still names the leader's
    group; otherwise ``[]``.
    """
    members = members_of(pgid)
    if at_exit is None or any(_same_start(members.get(p), t) for p, t in at_exit.items()):
        return list(members)
    return []


def _same_start(seen: float | None, recorded: float) -> bool:
    return seen is not None and abs(seen - recorded) <= _START_SLACK


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is not an error.

    Raises:
        ProcessControlError: not permitted, or ``pgid`` is 0, 1 or this process's
            own group (which would signal the supervisor itself).
    """
    if pgid <= 1 or pgid == os.getpgrp():
        raise ProcessControlError(f"refusing to signal process group {pgid}: not a server's group")
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        name = signal.Signals(sig).name
        raise ProcessControlError(f"not permitted to send {name} to group {pgid}: {e}") from e


def signal_group(pgid: int, sig: int, at_exit: Mapping[int, float] | None = None) -> bool:
    """Send ``sig`` to group ``pgid`` if it has members (and, with ``at_exit``, is
    proven the leader's group, see :func:`group_members`); returns whether it did.

    Raises:
        ProcessControlError: as :func:`kill_group`.
    """
    if not group_members(pgid, at_exit):
        return False
    kill_group(pgid, sig)
    return True


AtExit = Mapping[int, float] | None | Callable[[], Mapping[int, float] | None]


def _now(at_exit: AtExit) -> Mapping[int, float] | None:
    """The leader's exit snapshot as known right now (a callable is asked each time)."""
    return at_exit() if callable(at_exit) else at_exit


def _wait_group_gone(pgid: int, deadline: float, at_exit: AtExit) -> bool:
    while group_members(pgid, _now(at_exit)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_SCAN_INTERVAL)
    return True


def terminate_group(pgid: int, grace: float, at_exit: AtExit = None) -> None:
    """SIGTERM group ``pgid``, wait up to ``grace`` seconds, then SIGKILL what is left.

    Blocks until no live member remains. Works for a group this process did not
    spawn (a re-attached server), since it only scans the process table. Pass
    ``at_exit`` once the leader has exited (see :func:`group_members`): every
    signal then goes only to a group proven to be the leader's. Pass a callable
    to have it asked before every signal, so an exit seen during the grace
    period protects the rest of the termination (the group id may be reused).

    Raises:
        ProcessControlError: not permitted, or members outlived SIGKILL for 5 s.
    """
    if not signal_group(pgid, signal.SIGTERM, _now(at_exit)):
        return
    if _wait_group_gone(pgid, time.monotonic() + max(grace, 0.0), at_exit):
        return
    deadline = time.monotonic() + KILL_CONFIRM
    while members := group_members(pgid, _now(at_exit)):
        if time.monotonic() >= deadline:
            raise ProcessControlError(f"group {pgid} still has {members} after SIGKILL")
        kill_group(pgid, signal.SIGKILL)
        time.sleep(_SCAN_INTERVAL)


def find_process(identity: ProcessIdentity) -> psutil.Process | None:
    """The process ``identity`` names, if that very process still runs.

    Same boot, same pid and a start time within 1 s (see ``_START_SLACK``) of
    the recorded one; a reused pid has a later start time and is refused, as is
    a zombie.
    """
    if identity.boot_id != boot_id():
        return None
    proc = same_process(identity.pid, identity.start_time)
    if proc is None:
        return None
    try:
        zombie = proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return None
    return None if zombie else proc


def same_process(pid: int, start_time: float) -> psutil.Process | None:
    """``pid`` if it is still the process created at ``start_time`` (within 1 s;
    zombies included), else None. The caller checks the boot."""
    try:
        proc = psutil.Process(pid)
        started = proc.create_time()
    except psutil.Error:
        return None
    return proc if _same_start(started, start_time) else None


def terminate_identity(identity: ProcessIdentity, grace: float) -> bool:
    """Terminate a server left by an earlier node process (blocking).

    Its group is signalled only if :func:`find_process` confirms the very
    same process still runs, so a reused pid is never touched. Returns
    whether it was found (and is now gone).

    Raises:
        ProcessControlError: as :func:`terminate_group`.
    """
    if find_process(identity) is None:
        return False
    terminate_group(identity.pgid, grace)
    return True


def tree_rss_bytes(pid: int) -> int | None:
    """Resident memory (bytes) of ``pid`` and all its descendants; None if it is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        total = int(root.memory_info().rss)
    except psutil.Error:
        return None
    for child in procs[1:]:
        try:
            total += int(child.memory_info().rss)
        except psutil.Error:
            continue  # exited while being counted
    return total
