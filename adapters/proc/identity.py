"""Process identity: recognising one process again, across a node restart.

A pid alone names nobody for long: it is reused. A process is named by its
pid, its start time (psutil's ``create_time``, seconds since the epoch) and
the kernel's boot id; :func:`find_process` vouches for a recorded identity
only while that very process runs. These read the machine directly: they
are what :class:`~.system.RealSystem` and the pidfd handles are built on.
Source: ``reference/infer_lifecycle.rs.txt`` (a server is only ever one this
node spawned itself).
"""

from __future__ import annotations

import time

import msgspec
import psutil

from .table import same_start

__all__ = ["ProcessIdentity", "boot_id", "find_process", "identity_of", "own_age_s", "same_process"]

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


def own_age_s() -> float:
    """Seconds since this process started (wall clock against its ``create_time``,
    which the kernel keeps to a clock tick); 0.0 when it cannot be read."""
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return 0.0


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


def find_process(identity: ProcessIdentity) -> psutil.Process | None:
    """The process ``identity`` names, if that very process still runs.

    Same boot, same pid and a start time within 1 s (``table.START_SLACK``) of
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
    return proc if same_start(started, start_time) else None
