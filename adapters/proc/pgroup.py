"""Process groups: listing, signalling and emptying a server's group.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (stopping a
server's process; a server is only ever one this node spawned). A managed
server leads its own process group, so these work on the group: every child it
started is reached. Every call goes through a :class:`~.system.System`
(the machine unless a test passes a fake).

A process group id is the leader's pid, and Linux hands out no pid that is
still some group's id, so a group id names the same group as long as one of
its members lives. Once the leader has exited, a group is recognised as the
leader's only while it still holds one of the processes (pid and start time)
that were in it when the exit was seen (``at_exit``): a group that emptied and
whose id came back with a new process would hold none of them. See
``docs/process-supervision.md``.

There is no graceful termination here: the grace between SIGTERM and SIGKILL
is the decision core's ``kill`` timer (``actors/core/common.py``,
``begin_termination``); these send one signal, or SIGKILL until the group is
empty.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping

from .errors import ProcessControlError
from .identity import ProcessIdentity, find_process
from .system import REAL, System
from .table import same_start

__all__ = [
    "KILL_CONFIRM",
    "AtExit",
    "group_members",
    "kill_group",
    "kill_group_until_gone",
    "kill_identity",
    "signal_group",
    "tree_rss_bytes",
]

KILL_CONFIRM = 5.0  # s a group is given to vanish after SIGKILL
_SCAN_INTERVAL = 0.02  # s between process-table scans while waiting on a group

#: The leader's exit snapshot (pid -> start time), or a callable asked for it
#: before every signal (the exit may be seen while a kill is under way).
AtExit = Mapping[int, float] | None | Callable[[], Mapping[int, float] | None]


def group_members(
    pgid: int, at_exit: Mapping[int, float] | None = None, system: System = REAL
) -> list[int]:
    """Live pids whose process group is ``pgid`` (zombies excluded).

    With ``at_exit`` (the members seen when the leader's exit was observed,
    pid -> start time) they are returned only while one of those very
    processes is among them, which proves the id still names the leader's
    group; otherwise ``[]``.
    """
    members = system.group_members(pgid)
    if at_exit is None or any(same_start(members.get(p), t) for p, t in at_exit.items()):
        return list(members)
    return []


def kill_group(pgid: int, sig: int, system: System = REAL) -> None:
    """Send ``sig`` to process group ``pgid``; a group already gone is not an error.

    Raises:
        ProcessControlError: not permitted, or ``pgid`` is 0, 1 or this process's
            own group (which would signal the supervisor itself).
    """
    if pgid <= 1 or pgid == system.own_group():
        raise ProcessControlError(f"refusing to signal process group {pgid}: not a server's group")
    try:
        system.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        name = signal.Signals(sig).name
        raise ProcessControlError(f"not permitted to send {name} to group {pgid}: {e}") from e


def signal_group(
    pgid: int, sig: int, at_exit: Mapping[int, float] | None = None, system: System = REAL
) -> bool:
    """Send ``sig`` to group ``pgid`` if it has members (and, with ``at_exit``, is
    proven the leader's group, see :func:`group_members`); returns whether it did.

    Raises:
        ProcessControlError: as :func:`kill_group`.
    """
    if not group_members(pgid, at_exit, system):
        return False
    kill_group(pgid, sig, system)
    return True


def _now(at_exit: AtExit) -> Mapping[int, float] | None:
    """The leader's exit snapshot as known right now (a callable is asked each time)."""
    return at_exit() if callable(at_exit) else at_exit


def kill_group_until_gone(pgid: int, at_exit: AtExit = None, system: System = REAL) -> None:
    """SIGKILL group ``pgid`` until no live member is left (blocking).

    Works for a group this process did not spawn (a re-attached server), since
    it only scans the process table. Pass ``at_exit`` once the leader has
    exited (see :func:`group_members`): every signal then goes only to a group
    proven to be the leader's; a callable is asked before every signal.

    Raises:
        ProcessControlError: not permitted, or members outlived SIGKILL for
            :data:`KILL_CONFIRM` seconds.
    """
    deadline = system.monotonic() + KILL_CONFIRM
    while members := group_members(pgid, _now(at_exit), system):
        if system.monotonic() >= deadline:
            raise ProcessControlError(f"group {pgid} still has {members} after SIGKILL")
        kill_group(pgid, signal.SIGKILL, system)
        system.sleep(_SCAN_INTERVAL)


def kill_identity(identity: ProcessIdentity) -> bool:
    """SIGKILL the group of a server left by an earlier node process, until it
    is empty (blocking). Only if :func:`~.identity.find_process` confirms the
    very same process still runs, so a reused pid is never touched. Returns
    whether it was found (and is now gone).

    Raises:
        ProcessControlError: as :func:`kill_group_until_gone`.
    """
    if find_process(identity) is None:
        return False
    kill_group_until_gone(identity.pgid)
    return True


def tree_rss_bytes(pid: int, system: System = REAL) -> int | None:
    """Resident memory (bytes) of ``pid`` and all its descendants; None if it is gone."""
    total = system.rss_bytes(pid)
    if total is None:
        return None
    for child in system.children(pid):
        total += system.rss_bytes(child) or 0  # exited while being counted: 0
    return total
