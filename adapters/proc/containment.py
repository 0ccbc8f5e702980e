"""Which containment this node uses: cgroup v2, cgroup v1, or process groups.

``[node] containment`` chooses (``auto`` picks the first that works):

=========== ============================================================
``cgroup2`` membership and ``cgroup.kill`` in the cgroup v2 hierarchy
``cgroup1`` membership in the v1 freezer hierarchy; kill = freeze, SIGKILL
            every member, thaw
``pgroup``  no cgroups: process groups plus descendant tracking
=========== ============================================================

Memory (limit, usage, OOM kills) is taken where the memory controller is:
the v2 hierarchy when it is enabled there, else the v1 memory hierarchy (a
hybrid host, as the machines this project is tested on). CPU time comes from
v2 ``cpu.stat`` (present in every v2 cgroup) or v1 ``cpuacct.usage``. The
layout of one instance's cgroups is in :mod:`.cgroups`; the mounted
hierarchies are parsed by :mod:`.mounts`. See ``docs/process-supervision.md``
(containment) and the kernel's ``Documentation/admin-guide/cgroup-v2.rst``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from dataclasses import dataclass, field

from .cgroups import InstanceCgroup
from .mounts import Hierarchy, hierarchies
from .system import REAL, System

__all__ = ["MODES", "Containment", "base_name", "detect", "no_containment"]

#: Values of ``[node] containment``.
MODES = ("auto", "cgroup2", "cgroup1", "pgroup")
_MOUNTINFO = "/proc/self/mountinfo"
_PROC_CGROUP = "/proc/self/cgroup"


def base_name(node_id: str, data_dir: str) -> str:
    """The node's base cgroup name: unique per data directory, since many nodes
    (the test suite's, often with one node id) share one machine."""
    digest = hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:8]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in node_id)[:40]
    return f"infervisor-{safe}-{digest}"


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
    system: System = field(default=REAL, compare=False, repr=False)

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
            system=self.system,
        )

    def instances(self) -> list[str]:
        """Instance ids that have a cgroup under the node's base."""
        if self.base is None or not self.system.cg_isdir(self.base):
            return []
        return self.system.cg_list(self.base)

    def remove_empty(self) -> None:
        """Remove every empty cgroup under the node's bases, and the bases (best effort)."""
        for b in (self.base, self.memory_base, self.cpuacct_base):
            if b is not None and self.system.cg_isdir(b):
                for cg in self.system.cg_walk(b):
                    with contextlib.suppress(OSError):
                        self.system.cg_remove(cg)


def no_containment(
    reason: str = 'containment = "pgroup" in the node\'s configuration',
) -> Containment:
    """Process groups plus descendant tracking only."""
    return Containment(mode="pgroup", reason=f"{reason}: process groups with descendant tracking")


def _usable(system: System, base: str, probe: str) -> str | None:
    """Why ``base`` (made if missing) cannot hold our cgroups, or None if it can."""
    try:
        system.cg_make(base)
        test = os.path.join(base, f".probe-{os.getpid()}")
        system.cg_make(test)
        try:
            if not system.cg_exists(os.path.join(test, probe)):
                return f"{probe} is missing in a child cgroup"
        finally:
            system.cg_remove(test)
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
    mode: str,
    node_id: str,
    data_dir: str,
    found: list[Hierarchy] | None = None,
    system: System = REAL,
) -> Containment:
    """The node's containment for ``mode`` (one of :data:`MODES`).

    ``auto`` tries cgroup v2, then v1, then falls back to ``pgroup``; a mode
    named explicitly that cannot be used also falls back, and ``reason`` says
    why. Creates the node's base cgroups. ``found``: the mounted hierarchies
    (None: this process's, from ``/proc/self``); ``system``: the seam.

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
    memory = _memory(system, found, name)
    if mode in ("auto", "cgroup2") and (c := _cgroup2(system, found, name, memory, why)):
        return c
    if mode in ("auto", "cgroup1") and (c := _cgroup1(system, found, name, memory, why)):
        return c
    return no_containment("no writable cgroup hierarchy (" + "; ".join(why) + ")")


_Memory = tuple[str | None, bool, str | None]  # base, is v2, description


def _cgroup2(
    system: System, found: list[Hierarchy], name: str, memory: _Memory, why: list[str]
) -> Containment | None:
    """cgroup v2 containment, or None (and why appended)."""
    v2 = next((h for h in found if h.version == 2), None)
    if v2 is None:
        why.append("no cgroup v2 hierarchy is mounted")
        return None
    if (problem := _usable(system, os.path.join(v2.own, name), "cgroup.kill")) is not None:
        why.append(f"cgroup v2 at {v2.mount}: {problem}")
        return None
    return Containment(
        mode="cgroup2",
        reason=f"cgroup v2 at {v2.mount}, writable, cgroup.kill present",
        base=os.path.join(v2.own, name),
        memory_base=memory[0],
        memory_v2=memory[1],
        memory=memory[2],
        system=system,
    )


def _cgroup1(
    system: System, found: list[Hierarchy], name: str, memory: _Memory, why: list[str]
) -> Containment | None:
    """cgroup v1 (freezer) containment, or None (and why appended)."""
    v1 = {c: h for h in found if h.version == 1 for c in h.controllers}
    freezer = v1.get("freezer")
    if freezer is None:
        why.append("no cgroup v1 freezer hierarchy is mounted")
        return None
    if (problem := _usable(system, os.path.join(freezer.own, name), "freezer.state")) is not None:
        why.append(f"cgroup v1 freezer at {freezer.mount}: {problem}")
        return None
    base, memory_v2, note = memory
    return Containment(
        mode="cgroup1",
        reason=f"cgroup v1 freezer at {freezer.mount}, writable"
        + (f" ({'; '.join(why)})" if why else ""),
        base=os.path.join(freezer.own, name),
        memory_base=None if memory_v2 else base,
        cpuacct_base=os.path.join(v1["cpuacct"].own, name) if "cpuacct" in v1 else None,
        memory=None if memory_v2 else note,
        system=system,
    )


def _memory(system: System, found: list[Hierarchy], name: str) -> _Memory:
    """Where the memory controller is: (base, is v2, description)."""
    for h in found:
        offered = (system.cg_read(os.path.join(h.own, "cgroup.controllers")) or "").split()
        if h.version == 2 and "memory" in offered:
            base = os.path.join(h.own, name)
            with contextlib.suppress(OSError):
                system.cg_make(base)
                _enable_memory(system, h)
                system.cg_write(os.path.join(base, "cgroup.subtree_control"), "+memory")
                return base, True, f"cgroup v2 memory controller at {h.mount}"
    for h in found:
        if h.version == 1 and "memory" in h.controllers:
            base = os.path.join(h.own, name)
            if _usable(system, base, "memory.limit_in_bytes") is None:
                return base, False, f"cgroup v1 memory controller at {h.mount} (hybrid host)"
    return None, False, None


def _enable_memory(system: System, h: Hierarchy) -> None:
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
        system.cg_write(control, "+memory")
    except OSError as e:
        if e.errno != errno.EBUSY or h.own == h.mount:
            raise
        leaf = os.path.join(h.own, "supervisor")
        system.cg_make(leaf)
        system.cg_write(os.path.join(leaf, "cgroup.procs"), "0")
        system.cg_write(control, "+memory")
