"""Process groups and process identity: signalling, scanning, recognising.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``terminate``
of a server's process; a server is only ever one this node spawned). A managed
server leads its own process group, so these work on the group: every child it
started is reached. :mod:`.process` re-exports the public names.
"""

from __future__ import annotations

import os
import signal
import time

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


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid`` (zombies excluded)."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) != pgid or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                continue
        except (OSError, psutil.Error):
            continue  # gone (or not ours to see) in the meantime
        members.append(pid)
    return members


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


def _wait_group_gone(pgid: int, deadline: float) -> bool:
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_SCAN_INTERVAL)
    return True


def terminate_group(pgid: int, grace: float) -> None:
    """SIGTERM group ``pgid``, wait up to ``grace`` seconds, then SIGKILL what is left.

    Blocks until no live member remains. Works for a group this process did not
    spawn (a re-attached server), since it only scans the process table.

    Raises:
        ProcessControlError: not permitted, or members outlived SIGKILL for 5 s.
    """
    if not group_members(pgid):
        return
    kill_group(pgid, signal.SIGTERM)
    if _wait_group_gone(pgid, time.monotonic() + max(grace, 0.0)):
        return
    deadline = time.monotonic() + KILL_CONFIRM
    while members := group_members(pgid):
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
    try:
        proc = psutil.Process(identity.pid)
        started, status = proc.create_time(), proc.status()
    except psutil.Error:
        return None
    if status == psutil.STATUS_ZOMBIE or abs(started - identity.start_time) > _START_SLACK:
        return None
    return proc


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
