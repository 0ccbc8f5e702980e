"""Containment: each managed server in a cgroup of its own, where the node can make one.

A process can leave its process group (``setsid``) and its parent (a double
fork), but not its cgroup: a cgroup's member list is the kernel's list of a
server's whole tree. :mod:`.containment` finds the hierarchies the node may
use (cgroup v2, the v1 freezer, or none); this module is one instance's
cgroups. Every file and signal goes through a :class:`~.system.System` (the
machine, or a test's in-memory fake). See ``docs/process-supervision.md``
(containment) and the kernel's ``Documentation/admin-guide/cgroup-v2.rst``
(``cgroup.kill``, ``memory.events``) and ``cgroup-v1/freezer-subsystem.rst``.

Layout, in each hierarchy used (``<own>`` is the node's own cgroup there)::

    <own>/infervisor-<node id>-<8 hex of hash(realpath(data dir))>/
        <instance id>/shim      the exit-status shim (never killed with the server)
        <instance id>/server    the server and everything it starts

The shim is moved into ``shim`` before it is given its launch configuration,
and the server joins ``server`` before ``exec`` (the shim's ``preexec_fn``),
so from the moment a launch can start a server, every process of it is
somewhere under ``<instance id>``, whatever moment the node dies at.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field

from .errors import ProcessControlError
from .system import REAL, System

__all__ = ["KILL_CONFIRM", "InstanceCgroup", "keyed", "members"]

KILL_CONFIRM = 5.0  # s a cgroup is given to empty after SIGKILL
_POLL = 0.02  # s between looks at a cgroup's members


def keyed(text: str | None, key: str) -> int | None:
    """``key N`` from a flat-keyed cgroup file (memory.events, cpu.stat, ...)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def members(system: System, top: str) -> set[int]:
    """Live (non-zombie) processes of cgroup ``top`` and every cgroup below it."""
    pids: set[int] = set()
    for cg in system.cg_walk(top):
        for line in (system.cg_read(os.path.join(cg, "cgroup.procs")) or "").split():
            with contextlib.suppress(ValueError):
                pids.add(int(line))
    return {p for p in pids if system.is_live(p)}


@dataclass(frozen=True)
class InstanceCgroup:
    """The cgroups of one instance (see the module docstring's layout).

    ``tree`` is the instance's directory in the membership hierarchy (v2, or
    the v1 freezer); ``memory`` its directory in the hierarchy holding the
    memory controller (None: no memory cgroup); ``cpuacct`` a v1 cpuacct
    directory (None: CPU time from v2 ``cpu.stat`` in ``tree``, or nowhere).
    """

    iid: str
    tree: str
    v2: bool
    memory: str | None = None
    memory_v2: bool = False
    cpuacct: str | None = None
    memory_max: int | None = None  # bytes, written by create()
    system: System = field(default=REAL, compare=False, repr=False)

    def _dirs(self) -> list[str]:
        return [d for d in (self.tree, self.memory, self.cpuacct) if d is not None and d != ""]

    def create(self) -> None:
        """Make the instance's cgroups (idempotent) and write the memory limit.

        Raises:
            ProcessControlError: a cgroup could not be created, or the limit written.
        """
        system = self.system
        try:
            system.cg_make(os.path.join(self.tree, "shim"))
            for d in self._dirs():
                system.cg_make(d)
                if d == self.memory and self.memory_v2:  # no processes in <iid>: allowed
                    system.cg_write(os.path.join(d, "cgroup.subtree_control"), "+memory")
                system.cg_make(os.path.join(d, "server"))
        except OSError as e:
            raise ProcessControlError(f"cannot create the cgroups of {self.iid}: {e}") from e
        self.set_memory_max(self.memory_max)

    def shim_procs(self) -> list[str]:
        """The ``cgroup.procs`` files the shim is moved into."""
        return [os.path.join(self.tree, "shim", "cgroup.procs")]

    def server_procs(self) -> list[str]:
        """The ``cgroup.procs`` files the server joins before ``exec``."""
        return [os.path.join(d, "server", "cgroup.procs") for d in dict.fromkeys(self._dirs())]

    def members(self) -> set[int]:
        """Every live process of the instance (shim and server trees): the kernel's list."""
        return members(self.system, self.tree) if self.system.cg_isdir(self.tree) else set()

    def server_members(self) -> set[int]:
        """Every live process of the server's tree."""
        server = os.path.join(self.tree, "server")
        return members(self.system, server) if self.system.cg_isdir(server) else set()

    def signal_outside_group(self, sig: int, pgid: int) -> list[int]:
        """Send ``sig`` to every member of the server's cgroup that is not in
        process group ``pgid`` (those the group signal misses: a ``setsid``
        daemon); the pids signalled. The list is the kernel's, read just before."""
        sent = []
        for pid in sorted(self.server_members()):
            with contextlib.suppress(OSError):
                if self.system.pgid(pid) not in (pgid, None):
                    self.system.kill(pid, sig)
                    sent.append(pid)
        return sent

    def kill(self, *, everything: bool = False, wait: bool = True) -> None:
        """SIGKILL every process of the server's cgroup (``everything``: the
        shim's too) and block until it is empty (``wait`` False: one pass).

        v2: ``cgroup.kill``; v1: freeze, SIGKILL each member, thaw.

        Raises:
            ProcessControlError: not permitted, or a member outlived SIGKILL for 5 s.
        """
        system = self.system
        top = self.tree if everything else os.path.join(self.tree, "server")
        if not system.cg_isdir(top):
            return
        deadline = system.monotonic() + KILL_CONFIRM
        while left := members(system, top):
            if system.monotonic() >= deadline:
                raise ProcessControlError(f"cgroup {top} still holds {sorted(left)} after SIGKILL")
            try:
                self._kill_once(top, left)
            except OSError as e:
                raise ProcessControlError(f"cannot kill the members of {top}: {e}") from e
            if not wait:
                return
            system.sleep(_POLL)

    def _kill_once(self, top: str, left: set[int]) -> None:
        system = self.system
        if self.v2:
            for cg in system.cg_walk(top):
                system.cg_write(os.path.join(cg, "cgroup.kill"), "1")
            return
        states = [os.path.join(cg, "freezer.state") for cg in system.cg_walk(top)]
        for path in reversed(states):  # parents first: children inherit FROZEN
            with contextlib.suppress(OSError):
                system.cg_write(path, "FROZEN")
        try:
            for pid in members(system, top) | left:
                with contextlib.suppress(ProcessLookupError):
                    system.kill(pid, signal.SIGKILL)
        finally:
            for path in reversed(states):
                with contextlib.suppress(OSError):
                    system.cg_write(path, "THAWED")

    def set_memory_max(self, limit: int | None) -> None:
        """Write the server's memory limit in bytes (None: no limit).

        Raises:
            ProcessControlError: there is no memory cgroup, or the write failed.
        """
        if self.memory is None:
            if limit is None:
                return
            raise ProcessControlError(f"{self.iid}: no memory cgroup for a limit of {limit} bytes")
        server = os.path.join(self.memory, "server")
        try:
            if self.memory_v2:
                value = "max" if limit is None else str(limit)
                self.system.cg_write(os.path.join(server, "memory.max"), value)
                return
            value = "-1" if limit is None else str(limit)
            memsw = os.path.join(server, "memory.memsw.limit_in_bytes")
            order = (
                ["memory.limit_in_bytes", memsw]
                if limit is not None
                else [memsw, "memory.limit_in_bytes"]
            )
            for name in order:  # memsw >= limit at every step
                path = os.path.join(server, name)
                if self.system.cg_exists(path):
                    self.system.cg_write(path, value)
        except OSError as e:
            raise ProcessControlError(
                f"{self.iid}: cannot set the memory limit {limit}: {e}"
            ) from e

    def oom_kills(self) -> int | None:
        """How many times the kernel's OOM killer killed in the server's cgroup
        (v2 ``memory.events`` or v1 ``memory.oom_control`` ``oom_kill``)."""
        if self.memory is None:
            return None
        name = "memory.events" if self.memory_v2 else "memory.oom_control"
        return keyed(self.system.cg_read(os.path.join(self.memory, "server", name)), "oom_kill")

    def memory_bytes(self) -> int | None:
        """Memory charged to the server's whole tree, in bytes (None: unknown)."""
        if self.memory is None:
            return None
        name = "memory.current" if self.memory_v2 else "memory.usage_in_bytes"
        text = self.system.cg_read(os.path.join(self.memory, "server", name))
        return int(text) if text and text.strip().isdigit() else None

    def cpu_seconds(self) -> float | None:
        """CPU time used by the server's tree since its cgroup was made, seconds."""
        if self.v2:
            usec = keyed(
                self.system.cg_read(os.path.join(self.tree, "server", "cpu.stat")), "usage_usec"
            )
            return None if usec is None else usec / 1e6
        if self.cpuacct is not None:
            text = self.system.cg_read(os.path.join(self.cpuacct, "server", "cpuacct.usage"))
            return int(text) / 1e9 if text and text.strip().isdigit() else None
        return None

    def remove(self) -> None:
        """Remove the instance's cgroups that are empty (best effort)."""
        for d in self._dirs():
            if self.system.cg_isdir(d):
                for cg in self.system.cg_walk(d):
                    with contextlib.suppress(OSError):
                        self.system.cg_remove(cg)
