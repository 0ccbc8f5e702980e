"""A server's whole tree, as the node signals it: its process group, its cgroup
and the descendants it tracked.

This is the one termination mechanism of process supervision. It has no grace
period of its own: a stop is :meth:`ServerTree.sigterm` now, and
:meth:`ServerTree.kill_all` when the decision core's ``kill`` timer falls due
(``actors/core/common.py``, ``begin_termination``; the grace is the core's
``stop_grace_s`` or ``health_kill_grace_s``). Once the leader has exited,
:meth:`ServerTree.settle` gives what is left of a stop's grace to the rest of
the tree, signalling nothing. Every call goes through a :class:`~.system.System`,
so a test can run the whole escalation on :class:`~.fake.FakeSystem` without
real waits.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping

from .cgroups import InstanceCgroup
from .descendants import Descendants
from .pgroup import group_members, kill_group_until_gone, signal_group
from .system import System

__all__ = ["ServerTree"]

_SETTLE_POLL = 0.02  # s between looks at what is left of a server's tree


class ServerTree:
    """What one server started: group ``pgid``, ``cgroup`` (None: process groups
    and descendant tracking only) and ``descendants``.

    ``at_exit`` is asked before every signal for the group as it was when the
    leader's exit was seen (pid -> start time; None while the leader runs), so
    a group id reused after the group emptied is never signalled
    (:func:`~.pgroup.group_members`).
    """

    def __init__(
        self,
        system: System,
        pgid: int,
        cgroup: InstanceCgroup | None,
        descendants: Descendants,
        at_exit: Callable[[], Mapping[int, float] | None],
    ) -> None:
        self.system = system
        self.pgid = pgid
        self.cgroup = cgroup
        self.descendants = descendants
        self._at_exit = at_exit

    def sigterm(self) -> None:
        """SIGTERM the process group and, with a cgroup, every other member of it
        (a ``setsid`` daemon is asked to end too, as systemd stops a unit);
        returns at once.

        Raises:
            ProcessControlError: the group could not be signalled.
        """
        signal_group(self.pgid, signal.SIGTERM, self._at_exit(), self.system)
        if self.cgroup is not None:
            self.cgroup.signal_outside_group(signal.SIGTERM, self.pgid)

    def kill(self) -> None:
        """One pass of SIGKILL to the cgroup and the group; returns at once.

        Raises:
            ProcessControlError: the group could not be signalled.
        """
        if self.cgroup is not None:
            self.cgroup.kill(wait=False)
        signal_group(self.pgid, signal.SIGKILL, self._at_exit(), self.system)

    def left(self) -> bool:
        """Whether anything of the tree (the group, the cgroup) is still alive."""
        if self.cgroup is not None and self.cgroup.server_members():
            return True
        return bool(group_members(self.pgid, self._at_exit(), self.system))

    def settle(self, grace: float) -> None:
        """Wait up to ``grace`` seconds, signalling nothing, for the tree to end
        by itself (a stop gives its grace to the children too)."""
        deadline = self.system.monotonic() + max(grace, 0.0)
        while self.system.monotonic() < deadline and self.left():
            self.system.sleep(_SETTLE_POLL)

    def survivors(self, leader: int) -> list[int]:
        """Live members of the group (and the cgroup) other than ``leader``, once
        the leader's exit has been seen (``[]`` before)."""
        at_exit = self._at_exit()
        if at_exit is None:
            return []
        found = set(group_members(self.pgid, at_exit, self.system))
        if self.cgroup is not None:
            found |= self.cgroup.server_members()
        return sorted(found - {leader})

    def kill_all(self) -> None:
        """SIGKILL everything of the tree, blocking until nothing is left: the
        cgroup (``cgroup.kill``, or the v1 freezer way) until it is empty, the
        group until it has no member, then every tracked descendant (deadline
        5 s each). Safe once everything has exited by itself.

        Raises:
            ProcessControlError: something could not be signalled or outlived SIGKILL.
        """
        if self.cgroup is not None:
            self.cgroup.kill()
        kill_group_until_gone(self.pgid, self._at_exit, self.system)
        self.descendants.kill_all()
