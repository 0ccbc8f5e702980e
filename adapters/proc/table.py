"""One read of the process table, shared by every instance of a reconcile tick.

Each managed server needs, once in a while, its descendants (to reach those
that leave its process group) and the resident memory of its process tree
(for status). Asking psutil per instance scans ``/proc`` once per instance; a
node with a thousand instances would scan it a thousand times a tick. The
supervisor reads the table once per reconcile tick instead
(:meth:`~.system.System.table`) and hands the snapshot to every instance, which
answers both questions from it without touching the system. Status and list
then report the memory seen at the last tick.

On Linux the table is read straight from ``/proc`` (:func:`read_proc_table`):
``/proc/PID/stat`` (parent, start time) and ``statm`` (resident pages) per
process, where psutil's ``process_iter`` opens ``/proc/stat`` (for the boot
time) as well per process and builds a ``Process`` object for each: 11 ms
against 3 ms for a hundred processes on the project's test machine
(``bench/socket_table.py`` prints both).
:meth:`~.system.RealSystem.table` falls back to psutil where ``/proc``
cannot be read.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

__all__ = ["PROC", "START_SLACK", "ProcessEntry", "ProcessTable", "read_proc_table", "same_start"]

#: Where procfs is mounted (a parameter of the reader, so tests can point elsewhere).
PROC = "/proc"

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


def _boot_time(proc: str) -> float:
    """``btime`` of ``<proc>/stat``: the boot time, seconds since the epoch, as psutil reads it."""
    with open(f"{proc}/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise OSError(f"no btime line in {proc}/stat")


def read_proc_table(proc: str = PROC) -> ProcessTable:
    """One read of the process table from ``<proc>/PID/stat`` and ``statm``.

    The fields are psutil's, computed as psutil computes them, so start times
    compare equal to ``psutil.Process.create_time`` (``starttime`` clock ticks
    / ``SC_CLK_TCK`` + ``btime``) and RSS to ``memory_info().rss`` (``statm``'s
    resident pages times the page size). Zombies, and processes that
    exit while the table is read, are left out.

    Raises:
        OSError: ``<proc>`` or ``<proc>/stat`` cannot be read (not Linux, not mounted).
        ValueError: a ``stat`` file not in the kernel's format.
    """
    booted = _boot_time(proc)
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    entries: dict[int, ProcessEntry] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                data = f.read()
            # stat's own rss is the kernel's per-CPU approximation; statm's is
            # the exact sum psutil reports
            with open(f"{proc}/{name}/statm", "rb") as f:
                resident = int(f.read().split()[1])
        except OSError:  # gone while we looked
            continue
        fields = data[data.rfind(b")") + 2 :].split()  # the name may hold spaces and ")"
        if fields[0] == b"Z":
            continue
        started = float(fields[19]) / ticks + booted
        entries[int(name)] = ProcessEntry(int(fields[1]), started, resident * page)
    return ProcessTable(entries)
