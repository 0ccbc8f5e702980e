"""Containment: each managed server in a cgroup of its own, where the node can make one.

A process can leave its process group (``setsid``) and its parent (a double
fork), but not its cgroup: a cgroup's member list is the kernel's list of a
server's whole tree. This module finds the hierarchies the node may use and
gives each instance its cgroups. See ``docs/process-supervision.md``
(containment) and the kernel's ``Documentation/admin-guide/cgroup-v2.rst``
(``cgroup.kill``, ``memory.events``) and ``cgroup-v1/freezer-subsystem.rst``.

Modes (``[node] containment``; ``auto`` picks the first that works):

=========== ============================================================
``cgroup2`` membership and ``cgroup.kill`` in the cgroup v2 hierarchy
``cgroup1`` membership in the v1 freezer hierarchy; kill = freeze, SIGKILL
            every member, thaw
``pgroup``  no cgroups: process groups plus descendant tracking
=========== ============================================================

Memory (limit, usage, OOM kills) is taken where the memory controller is:
the v2 hierarchy when it is enabled there, else the v1 memory hierarchy (a
hybrid host, as the machines this project is tested on). CPU time comes from
v2 ``cpu.stat`` (present in every v2 cgroup) or v1 ``cpuacct.usage``.

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
import errno
import hashlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .cgroup_mounts import Hierarchy, hierarchies
from .errors import ProcessControlError

__all__ = [
    "MODES",
    "Containment",
    "Hierarchy",
    "InstanceCgroup",
    "base_name",
    "detect",
    "hierarchies",
    "no_containment",
]

#: Values of ``[node] containment``.
MODES = ("auto", "cgroup2", "cgroup1", "pgroup")
KILL_CONFIRM = 5.0  # s a cgroup is given to empty after SIGKILL
_POLL = 0.02  # s between looks at a cgroup's members
_MOUNTINFO = "/proc/self/mountinfo"
_PROC_CGROUP = "/proc/self/cgroup"

_log = logging.getLogger(__name__)


def base_name(node_id: str, data_dir: str) -> str:
    """The node's base cgroup name: unique per data directory, since many nodes
    (the test suite's, often with one node id) share one machine."""
    digest = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:8]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in node_id)[:40]
    return f"infervisor-{safe}-{digest}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, value: str) -> None:
    """Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _keyed(text: str | None, key: str) -> int | None:
    """``key N`` from a flat-keyed cgroup file (memory.events, cpu.stat, ...)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _is_zombie(pid: int) -> bool:
    """A zombie stays listed until its parent reaps it, but runs nothing."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return True  # gone
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in ("Z", "X")


def _walk(top: str) -> Iterator[str]:
    """``top`` and every cgroup below it, deepest first (an rmdir order)."""
    for dirpath, _, _ in os.walk(top, topdown=False):
        yield dirpath


def _members(top: str) -> set[int]:
    """Live (non-zombie) processes of cgroup ``top`` and every cgroup below it."""
    pids: set[int] = set()
    for cg in _walk(top):
        for line in (_read(os.path.join(cg, "cgroup.procs")) or "").split():
            with contextlib.suppress(ValueError):
                pids.add(int(line))
    return {p for p in pids if not _is_zombie(p)}


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

    def _dirs(self) -> list[str]:
        return [d for d in (self.tree, self.memory, self.cpuacct) if d is not None and d != ""]

    def create(self) -> None:
        """Make the instance's cgroups (idempotent) and write the memory limit.

        Raises:
            ProcessControlError: a cgroup could not be created, or the limit written.
        """
        try:
            os.makedirs(os.path.join(self.tree, "shim"), exist_ok=True)
            for d in self._dirs():
                os.makedirs(d, exist_ok=True)
                if d == self.memory and self.memory_v2:  # no processes in <iid>: allowed
                    _write(os.path.join(d, "cgroup.subtree_control"), "+memory")
                os.makedirs(os.path.join(d, "server"), exist_ok=True)
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
        return _members(self.tree) if os.path.isdir(self.tree) else set()

    def server_members(self) -> set[int]:
        """Every live process of the server's tree."""
        server = os.path.join(self.tree, "server")
        return _members(server) if os.path.isdir(server) else set()

    def signal_outside_group(self, sig: int, pgid: int) -> list[int]:
        """Send ``sig`` to every member of the server's cgroup that is not in
        process group ``pgid`` (those the group signal misses: a ``setsid``
        daemon); the pids signalled. The list is the kernel's, read just before."""
        sent = []
        for pid in sorted(self.server_members()):
            with contextlib.suppress(OSError):
                if os.getpgid(pid) != pgid:
                    os.kill(pid, sig)
                    sent.append(pid)
        return sent

    def kill(self, *, everything: bool = False, wait: bool = True) -> None:
        """SIGKILL every process of the server's cgroup (``everything``: the
        shim's too) and block until it is empty (``wait`` False: one pass).

        v2: ``cgroup.kill``; v1: freeze, SIGKILL each member, thaw.

        Raises:
            ProcessControlError: not permitted, or a member outlived SIGKILL for 5 s.
        """
        top = self.tree if everything else os.path.join(self.tree, "server")
        if not os.path.isdir(top):
            return
        deadline = time.monotonic() + KILL_CONFIRM
        while left := _members(top):
            if time.monotonic() >= deadline:
                raise ProcessControlError(f"cgroup {top} still holds {sorted(left)} after SIGKILL")
            try:
                self._kill_once(top, left)
            except OSError as e:
                raise ProcessControlError(f"cannot kill the members of {top}: {e}") from e
            if not wait:
                return
            time.sleep(_POLL)

    def _kill_once(self, top: str, left: set[int]) -> None:
        if self.v2:
            for cg in _walk(top):
                _write(os.path.join(cg, "cgroup.kill"), "1")
            return
        states = [os.path.join(cg, "freezer.state") for cg in _walk(top)]
        for path in reversed(states):  # parents first: children inherit FROZEN
            with contextlib.suppress(OSError):
                _write(path, "FROZEN")
        try:
            for pid in _members(top) | left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            for path in reversed(states):
                with contextlib.suppress(OSError):
                    _write(path, "THAWED")

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
                _write(os.path.join(server, "memory.max"), "max" if limit is None else str(limit))
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
                if os.path.exists(path):
                    _write(path, value)
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
        return _keyed(_read(os.path.join(self.memory, "server", name)), "oom_kill")

    def memory_bytes(self) -> int | None:
        """Memory charged to the server's whole tree, in bytes (None: unknown)."""
        if self.memory is None:
            return None
        name = "memory.current" if self.memory_v2 else "memory.usage_in_bytes"
        text = _read(os.path.join(self.memory, "server", name))
        return int(text) if text and text.strip().isdigit() else None

    def cpu_seconds(self) -> float | None:
        """CPU time used by the server's tree since its cgroup was made, seconds."""
        if self.v2:
            usec = _keyed(_read(os.path.join(self.tree, "server", "cpu.stat")), "usage_usec")
            return None if usec is None else usec / 1e6
        if self.cpuacct is not None:
            text = _read(os.path.join(self.cpuacct, "server", "cpuacct.usage"))
            return int(text) / 1e9 if text and text.strip().isdigit() else None
        return None

    def remove(self) -> None:
        """Remove the instance's cgroups that are empty (best effort)."""
        for d in self._dirs():
            if os.path.isdir(d):
                for cg in _walk(d):
                    with contextlib.suppress(OSError):
                        os.rmdir(cg)


def _join(base: str | None, iid: str) -> str | None:
    return None if base is None else os.path.join(base, iid)


@dataclass(frozen=True)
class Containment:
    """How this node contains its servers: ``mode`` (``cgroup2``, ``cgroup1``,
    ``pgroup``) and ``reason`` (why, for status and node.log); ``memory`` says
    where memory limits go (None: nowhere)."""

    mode: str
    reason: str
    base: str | None = None  # the node's base cgroup in the membership hierarchy
    memory_base: str | None = None
    memory_v2: bool = False
    cpuacct_base: str | None = None
    memory: str | None = None

    def cgroup(self, iid: str, memory_max: int | None = None) -> InstanceCgroup | None:
        """The instance's cgroups (not yet created), with its memory limit in
        bytes; None in ``pgroup`` mode."""
        if self.base is None:
            return None
        return InstanceCgroup(
            iid=iid,
            tree=os.path.join(self.base, iid),
            v2=self.mode == "cgroup2",
            memory=_join(self.memory_base, iid),
            memory_v2=self.memory_v2,
            cpuacct=_join(self.cpuacct_base, iid),
            memory_max=memory_max,
        )

    def instances(self) -> list[str]:
        """Instance ids that have a cgroup under the node's base."""
        if self.base is None or not os.path.isdir(self.base):
            return []
        return sorted(e.name for e in os.scandir(self.base) if e.is_dir())

    def remove_empty(self) -> None:
        """Remove every empty cgroup under the node's bases, and the bases (best effort)."""
        for b in (self.base, self.memory_base, self.cpuacct_base):
            if b is not None and os.path.isdir(b):
                for cg in _walk(b):
                    with contextlib.suppress(OSError):
                        os.rmdir(cg)


def no_containment(
    reason: str = 'containment = "pgroup" in the node\'s configuration',
) -> Containment:
    """Process groups plus descendant tracking only."""
    return Containment(mode="pgroup", reason=f"{reason}: process groups with descendant tracking")


def _usable(base: str, probe: str) -> str | None:
    """Why ``base`` (made if missing) cannot hold our cgroups, or None if it can."""
    try:
        os.makedirs(base, exist_ok=True)
        test = os.path.join(base, f".probe-{os.getpid()}")
        os.makedirs(test, exist_ok=True)
        try:
            if not os.path.exists(os.path.join(test, probe)):
                return f"{probe} is missing in a child cgroup"
        finally:
            os.rmdir(test)
    except OSError as e:
        why = os.strerror(e.errno or errno.EIO)
        return f"cannot create a cgroup under {os.path.dirname(base)}: {why}"
    return None


def _read_own() -> tuple[str, str]:
    try:
        with open(_MOUNTINFO, encoding="utf-8") as m, open(_PROC_CGROUP, encoding="utf-8") as c:
            return m.read(), c.read()
    except OSError:
        return "", ""


def detect(
    mode: str, node_id: str, data_dir: str, found: list[Hierarchy] | None = None
) -> Containment:
    """The node's containment for ``mode`` (one of :data:`MODES`).

    ``auto`` tries cgroup v2, then v1, then falls back to ``pgroup``; a mode
    named explicitly that cannot be used also falls back, and ``reason`` says
    why. Creates the node's base cgroups.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"containment {mode!r}: allowed {', '.join(MODES)}")
    if mode == "pgroup":
        return no_containment()
    if found is None:
        found = hierarchies(*_read_own())
    name = base_name(node_id, data_dir)
    why: list[str] = []
    memory, memory_v2, mem_note = _memory(found, name)
    v1 = {c: h for h in found if h.version == 1 for c in h.controllers}
    cpuacct = os.path.join(v1["cpuacct"].own, name) if "cpuacct" in v1 else None
    if mode in ("auto", "cgroup2"):
        v2 = next((h for h in found if h.version == 2), None)
        if v2 is None:
            why.append("no cgroup v2 hierarchy is mounted")
        elif (problem := _usable(os.path.join(v2.own, name), "cgroup.kill")) is not None:
            why.append(f"cgroup v2 at {v2.mount}: {problem}")
        else:
            return Containment(
                mode="cgroup2",
                reason=f"cgroup v2 at {v2.mount}, writable, cgroup.kill present",
                base=os.path.join(v2.own, name),
                memory_base=memory,
                memory_v2=memory_v2,
                memory=mem_note,
            )
    if mode in ("auto", "cgroup1"):
        freezer = v1.get("freezer")
        if freezer is None:
            why.append("no cgroup v1 freezer hierarchy is mounted")
        elif (problem := _usable(os.path.join(freezer.own, name), "freezer.state")) is not None:
            why.append(f"cgroup v1 freezer at {freezer.mount}: {problem}")
        else:
            return Containment(
                mode="cgroup1",
                reason=f"cgroup v1 freezer at {freezer.mount}, writable"
                + (f" ({'; '.join(why)})" if why else ""),
                base=os.path.join(freezer.own, name),
                memory_base=None if memory_v2 else memory,
                cpuacct_base=cpuacct,
                memory=None if memory_v2 else mem_note,
            )
    return no_containment("no writable cgroup hierarchy (" + "; ".join(why) + ")")


def _memory(found: list[Hierarchy], name: str) -> tuple[str | None, bool, str | None]:
    """Where the memory controller is: (base, is v2, description)."""
    for h in found:
        offered = (_read(os.path.join(h.own, "cgroup.controllers")) or "").split()
        if h.version == 2 and "memory" in offered:
            base = os.path.join(h.own, name)
            with contextlib.suppress(OSError):
                os.makedirs(base, exist_ok=True)
                _enable_memory(h)
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
                return base, True, f"cgroup v2 memory controller at {h.mount}"
    for h in found:
        if h.version == 1 and "memory" in h.controllers:
            base = os.path.join(h.own, name)
            if _usable(base, "memory.limit_in_bytes") is None:
                return base, False, f"cgroup v1 memory controller at {h.mount} (hybrid host)"
    return None, False, None


def _enable_memory(h: Hierarchy) -> None:
    """Enable the v2 memory controller for the node's children.

    cgroup v2's "no internal processes" rule: a non-root cgroup with processes
    cannot enable a controller for its children (EBUSY). The node is then
    alone in its cgroup (a systemd unit's delegated subtree, ``Delegate=yes``),
    so it moves itself into the leaf ``<own>/supervisor`` first.

    Raises:
        OSError: the controller could not be enabled.
    """
    control = os.path.join(h.own, "cgroup.subtree_control")
    try:
        _write(control, "+memory")
    except OSError as e:
        if e.errno != errno.EBUSY or h.own == h.mount:
            raise
        leaf = os.path.join(h.own, "supervisor")
        os.makedirs(leaf, exist_ok=True)
        _write(os.path.join(leaf, "cgroup.procs"), "0")
        _write(control, "+memory")
