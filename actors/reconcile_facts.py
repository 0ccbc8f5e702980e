"""What a reconcile tick observes of one instance, from the node's one read of
each table per tick (an instance never scans itself): its server's
descendants and the RSS of its process tree, and the ports it listens on."""

from __future__ import annotations

from typing import Any

from infervisor.adapters.ports import ListenerSnapshot
from infervisor.adapters.proc.handles import ServerProcess
from infervisor.adapters.proc.table import ProcessTable

__all__ = ["listener_ports", "tree_rss_seen"]


def tree_rss_seen(
    proc: ServerProcess | None, table: ProcessTable | None, seen: tuple[int, int] | None
) -> tuple[int, int] | None:
    """Track the server's descendants; ``(pid, RSS of its tree in bytes)`` as this
    tick's table shows it (None: not in the table; ``seen`` when nothing was read)."""
    if table is None or proc is None:
        return seen
    proc.track_descendants(table)
    pid = proc.identity.pid
    rss = table.tree_rss_bytes(pid)
    return None if rss is None else (pid, rss)


def listener_ports(listeners: Any) -> dict[int, list[str]]:
    """The listeners of a snapshot by port (status' exposure of adopted servers)."""
    if isinstance(listeners, ListenerSnapshot):
        return listeners.ports()
    ports: dict[int, list[str]] = listeners
    return ports
