"""One read of the process table, shared by every instance of a reconcile tick.

Each managed server needs, once in a while, its descendants (to reach those
that leave its process group) and the resident memory of its process tree
(for status). Asking psutil per instance scans ``/proc`` once per instance; a
node with a thousand instances would scan it a thousand times a tick. The
supervisor reads the table once per reconcile tick instead
(:meth:`~.system.System.table`) and hands the snapshot to every instance, which
answers both questions from it without touching the system. Status and list
then report the memory seen at the last tick.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

__all__ = ["START_SLACK", "ProcessEntry", "ProcessTable", "same_start"]

#: Seconds within which two start times name the same process: psutil derives
#: them from clock ticks since boot plus ``/proc/stat``'s ``btime``, which is
#: whole seconds and follows wall-clock steps.
START_SLACK = 1.0


def same_start(seen: float | None, recorded: float) -> bool:
    """Whether a start time read now is the recorded one (within :data:`START_SLACK`)."""
    return seen is not None and abs(seen - recorded) <= START_SLACK


class ProcessEntry(NamedTuple):
    """One process: its parent's pid, its start time (seconds since the epoch,
    psutil's ``create_time``) and its resident set size (bytes)."""

    ppid: int
    started: float
    rss_bytes: int


class ProcessTable:
    """A snapshot: pid -> :class:`ProcessEntry`, with a child index.

    Processes that exit while the table is read, and zombies, are left out;
    nothing in it raises.
    """

    def __init__(self, entries: dict[int, ProcessEntry]) -> None:
        self.entries = entries
        self._children: dict[int, list[int]] = {}
        for pid, entry in entries.items():
            self._children.setdefault(entry.ppid, []).append(pid)

    def is_alive(self, pid: int, started: float) -> bool:
        """Whether ``pid`` is in the table with this start time (not a reused pid)."""
        entry = self.entries.get(pid)
        return entry is not None and same_start(entry.started, started)

    def descendants(self, pid: int) -> dict[int, float]:
        """Every live descendant of ``pid`` (not ``pid`` itself): pid -> start time."""
        found: dict[int, float] = {}
        todo = list(self._children.get(pid, ()))
        while todo:
            kid = todo.pop()
            if kid in found or kid == pid:
                continue
            found[kid] = self.entries[kid].started
            todo.extend(self._children.get(kid, ()))
        return found

    def tree_rss_bytes(self, pid: int) -> int | None:
        """RSS of ``pid`` and its descendants (bytes); None when ``pid`` is not in the table.

        Shared pages are counted once per process, as ``ps`` does: an upper bound.
        """
        entry = self.entries.get(pid)
        if entry is None:
            return None
        total = entry.rss_bytes
        for kid in self.descendants(pid):
            with contextlib.suppress(KeyError):
                total += self.entries[kid].rss_bytes
        return total
