"""The cgroup hierarchies mounted on this machine and the node's own cgroup in each.

Pure parsing of ``/proc/self/mountinfo`` (proc(5)) and ``/proc/self/cgroup``
(cgroups(7)); :mod:`.cgroups` decides which of them to use.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Hierarchy", "hierarchies"]

#: cgroup v1 controllers (a mount option naming one binds it to the hierarchy).
_V1_CONTROLLERS = frozenset({
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "blkio",
    "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc",
})  # fmt: skip


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy and the node's own cgroup in it.

    ``version`` 2 or 1; ``controllers`` the v1 controllers bound to it (empty
    for v2); ``mount`` its mount point; ``own`` the node's own cgroup as a
    directory (mount point joined with the node's path in the hierarchy).
    """

    version: int
    controllers: frozenset[str]
    mount: str
    own: str


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def hierarchies(mountinfo: str, proc_cgroup: str) -> list[Hierarchy]:
    """The cgroup hierarchies mounted here with the node's own cgroup in each.

    Args:
        mountinfo: the text of ``/proc/self/mountinfo`` (proc(5)).
        proc_cgroup: the text of ``/proc/self/cgroup`` (cgroups(7):
            ``id:controllers:path``; ``0::path`` is v2).
    """
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            key = "" if parts[0] == "0" and not parts[1] else parts[1]
            own[key] = parts[2]
    found: list[Hierarchy] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            version, controllers, key = 2, frozenset[str](), ""
        else:
            opts = tail[2].split(",")
            names = [o for o in opts if o.startswith("name=") or o in _V1_CONTROLLERS]
            version, controllers, key = 1, frozenset(names), ",".join(names)
            key = next((k for k in own if k and set(k.split(",")) == set(names)), key)
        path = own.get(key)
        if path is None:
            continue
        relative = path[len(root) :] if root != "/" and path.startswith(root) else path
        found.append(Hierarchy(version, controllers, mount, mount + relative.rstrip("/")))
    return found
