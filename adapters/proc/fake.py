"""An in-memory operating system for tests: processes and cgroups, with a clock
that moves only when something sleeps.

:class:`FakeSystem` satisfies :class:`~.system.System`, as supervisor's
``DummyOptions`` stands in for its OS calls and httpx's ``MockTransport`` for
the network. A test makes processes (:meth:`FakeSystem.start`,
:meth:`FakeSystem.fork`) that ignore SIGTERM or take a while to obey it,
makes them exit (:meth:`FakeSystem.exit`), and reads what was sent
(:attr:`FakeSystem.sent`, :attr:`FakeSystem.writes`). :meth:`FakeSystem.sleep`
advances the clock and delivers what falls due, so a grace period of 30 s
costs no real time.

Semantics kept from Linux: a pid names one process at a time and a reused pid
has a later start time; SIGKILL cannot be ignored; a dead process's children
are re-parented to pid 1; writing a pid to a cgroup's ``cgroup.procs`` moves
it; a child is born in its parent's process group and cgroup;
``cgroup.kill`` SIGKILLs every member of the cgroup and the cgroups below;
``rmdir`` of a cgroup with members or children is refused (EBUSY). Not
modelled: zombies (a process is reaped at once), sessions beyond ``setsid``,
and signals other than SIGTERM, SIGKILL and 0 (ignored).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

from .system import Spawn
from .table import ProcessEntry, ProcessTable, same_start

__all__ = ["FakeChild", "FakeProcess", "FakeSystem"]

_CONTROL_FILES = frozenset({
    "cgroup.procs", "cgroup.kill", "cgroup.subtree_control", "cgroup.controllers",
    "freezer.state", "memory.max", "memory.current", "memory.events",
    "memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.usage_in_bytes",
    "memory.oom_control", "cpu.stat", "cpuacct.usage",
})  # fmt: skip


@dataclass
class FakeProcess:
    """One in-memory process. ``ignores``: signals it catches and carries on
    after; ``term_delay``: seconds it takes to exit after SIGTERM."""

    pid: int
    ppid: int
    pgid: int
    started: float
    env: dict[str, str] = field(default_factory=dict)
    rss: int = 0
    ignores: frozenset[int] = frozenset()
    term_delay: float = 0.0
    cgroups: dict[str, str] = field(default_factory=dict)  # hierarchy (mount) -> cgroup


@dataclass
class FakeChild:
    """A process :meth:`FakeSystem.spawn` started (the :class:`~.system.Child` shape)."""

    system: FakeSystem
    pid: int
    returncode: int | None = None
    stdin: IO[bytes] | None = None
    stdout: IO[bytes] | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.pid in self.system.ended:
            code, sig = self.system.ended[self.pid]
            self.returncode = -sig if sig is not None else (code or 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        while self.poll() is None:
            if timeout is not None and timeout <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), 0.0)
            step = 0.1 if timeout is None else min(0.1, timeout)
            self.system.sleep(step)
            timeout = None if timeout is None else timeout - step
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.system.kill(self.pid, signal.SIGKILL)


class FakeSystem:
    """Processes, process groups and cgroups in memory (see the module docstring).

    ``boot``: the boot id; ``own_group``: the node's own process group;
    ``clock``: where the monotonic clock starts (seconds); start times are
    ``epoch`` plus the clock. ``mounts``: the cgroup hierarchies (a process is
    in one cgroup of each; a path under none is in the hierarchy ``/``).
    """

    def __init__(
        self,
        *,
        boot: str = "fake-boot",
        own_group: int = 100,
        clock: float = 0.0,
        mounts: Sequence[str] = (),
    ) -> None:
        self.boot = boot
        self.mounts = sorted(mounts, key=len, reverse=True)
        self._own_group = own_group
        self.now = clock
        self.epoch = 1_700_000_000.0
        self.processes: dict[int, FakeProcess] = {}
        self.ended: dict[int, tuple[int | None, int | None]] = {}  # pid -> (code, signal)
        self.sent: list[tuple[str, int, int]] = []  # ("pid"|"group", id, signal)
        self.writes: list[tuple[str, str]] = []  # cgroup file, value
        self.dirs: set[str] = set()
        self.files: dict[str, str] = {}
        self._due: list[tuple[float, int, float]] = []  # (when, pid, started)
        self._next_pid = 1000

    # ---------------------------------------------------------------- for tests
    def start(
        self,
        *,
        ppid: int = 1,
        pgid: int | None = None,
        env: Mapping[str, str] | None = None,
        rss: int = 0,
        ignores: Sequence[int] = (),
        term_delay: float = 0.0,
        cgroup: str | None = None,
    ) -> FakeProcess:
        """A new process; ``pgid`` None: it leads a new group (``setsid``)."""
        pid = self._new_pid()
        proc = FakeProcess(
            pid=pid, ppid=ppid, pgid=pid if pgid is None else pgid,
            started=self.epoch + self.now, env=dict(env or {}), rss=rss,
            ignores=frozenset(ignores), term_delay=term_delay,
        )  # fmt: skip
        if cgroup is not None:
            proc.cgroups[self._mount_of(cgroup)] = cgroup
        self.processes[pid] = proc
        return proc

    def fork(
        self,
        parent: int,
        *,
        setsid: bool = False,
        ignores: Sequence[int] = (),
        term_delay: float = 0.0,
    ) -> FakeProcess:
        """A child of ``parent`` in its group (``setsid``: a group of its own) and
        cgroup, with its environment."""
        up = self.processes[parent]
        group = None if setsid else up.pgid
        child = self.start(
            ppid=parent, pgid=group, env=up.env, ignores=ignores, term_delay=term_delay
        )
        child.cgroups = dict(up.cgroups)
        return child

    def exit(self, pid: int, code: int | None = 0, sig: int | None = None) -> None:
        """``pid`` ends (with ``code``, or killed by ``sig``); its children go to pid 1."""
        proc = self.processes.pop(pid, None)
        if proc is None:
            return
        self.ended[pid] = (None, sig) if sig is not None else (code, None)
        for other in self.processes.values():
            if other.ppid == pid:
                other.ppid = 1

    def oom(self, cgroup: str, kills: int) -> None:
        """Record ``kills`` OOM kills in ``cgroup`` (v2 and v1 files)."""
        self.files[os.path.join(cgroup, "memory.events")] = f"oom {kills}\noom_kill {kills}\n"
        self.files[os.path.join(cgroup, "memory.oom_control")] = f"oom_kill {kills}\n"

    def _mount_of(self, path: str) -> str:
        return next((m for m in self.mounts if path == m or path.startswith(m + "/")), "/")

    def _in(self, directories: Sequence[str]) -> list[FakeProcess]:
        """The processes in any of ``directories``."""
        return [p for p in self.processes.values() if set(p.cgroups.values()) & set(directories)]

    def _new_pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def _deliver(self, proc: FakeProcess, sig: int) -> None:
        if sig == 0 or (sig != signal.SIGKILL and sig in proc.ignores):
            return
        if sig == signal.SIGKILL or proc.term_delay <= 0:
            self.exit(proc.pid, sig=sig)
        elif sig == signal.SIGTERM:
            self._due.append((self.now + proc.term_delay, proc.pid, proc.started))

    # ---------------------------------------------------------------- clock
    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        due, self._due = (
            [d for d in self._due if d[0] <= self.now],
            [d for d in self._due if d[0] > self.now],
        )
        for _, pid, started in due:
            proc = self.processes.get(pid)
            if proc is not None and proc.started == started:
                self.exit(pid, sig=signal.SIGTERM)

    # ---------------------------------------------------------------- spawn and signals
    def spawn(self, what: Spawn) -> FakeChild:
        proc = self.start(ppid=os.getpid(), env=what.env)
        return FakeChild(self, proc.pid)

    def own_group(self) -> int:
        return self._own_group

    def kill(self, pid: int, sig: int) -> None:
        proc = self.processes.get(pid)
        if proc is None:
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        self.sent.append(("pid", pid, sig))
        self._deliver(proc, sig)

    def killpg(self, pgid: int, sig: int) -> None:
        members = [p for p in self.processes.values() if p.pgid == pgid]
        if not members:
            raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
        self.sent.append(("group", pgid, sig))
        for proc in members:
            self._deliver(proc, sig)

    def signal_exact(self, pid: int, start_time: float, sig: int) -> bool:
        proc = self.processes.get(pid)
        if proc is None or not same_start(proc.started, start_time):
            return False
        self.kill(pid, sig)
        return True

    # ---------------------------------------------------------------- process table
    def boot_id(self) -> str:
        return self.boot

    def start_time(self, pid: int) -> float | None:
        proc = self.processes.get(pid)
        return None if proc is None else proc.started

    def is_live(self, pid: int) -> bool:
        return pid in self.processes

    def pgid(self, pid: int) -> int | None:
        proc = self.processes.get(pid)
        return None if proc is None else proc.pgid

    def group_members(self, pgid: int) -> dict[int, float]:
        return {p.pid: p.started for p in self.processes.values() if p.pgid == pgid}

    def children(self, pid: int) -> dict[int, float]:
        return self.table().descendants(pid)

    def carriers(self, name: str, value: str) -> dict[int, float]:
        return {p.pid: p.started for p in self.processes.values() if p.env.get(name) == value}

    def rss_bytes(self, pid: int) -> int | None:
        proc = self.processes.get(pid)
        return None if proc is None else proc.rss

    def table(self) -> ProcessTable:
        return ProcessTable({
            p.pid: ProcessEntry(p.ppid, p.started, p.rss) for p in self.processes.values()
        })  # fmt: skip

    # ---------------------------------------------------------------- cgroup filesystem
    def cg_isdir(self, path: str) -> bool:
        return path in self.dirs

    def cg_exists(self, path: str) -> bool:
        parent, name = os.path.split(path)
        return path in self.dirs or (parent in self.dirs and name in _CONTROL_FILES)

    def cg_make(self, path: str) -> None:
        while path not in self.dirs and path not in ("", "/"):
            self.dirs.add(path)
            path = os.path.dirname(path)

    def cg_remove(self, path: str) -> None:
        if path not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        busy = any(d.startswith(path + "/") for d in self.dirs) or bool(self._in([path]))
        if busy:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)
        self.dirs.discard(path)

    def cg_walk(self, top: str) -> list[str]:
        below = [d for d in self.dirs if d == top or d.startswith(top + "/")]
        return sorted(below, key=lambda d: d.count("/"), reverse=True)

    def cg_list(self, path: str) -> list[str]:
        return sorted(os.path.basename(d) for d in self.dirs if os.path.dirname(d) == path)

    def cg_read(self, path: str) -> str | None:
        directory, name = os.path.split(path)
        if directory not in self.dirs:
            return None
        if name == "cgroup.procs":
            return "".join(f"{p.pid}\n" for p in self._in([directory]))
        if name in ("memory.current", "memory.usage_in_bytes"):
            return f"{sum(p.rss for p in self._in(self.cg_walk(directory)))}\n"
        return self.files.get(path)

    def cg_write(self, path: str, value: str) -> None:
        directory, name = os.path.split(path)
        if directory not in self.dirs:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        self.writes.append((path, value))
        if name == "cgroup.procs":
            proc = self.processes.get(int(value))
            if proc is None and value != "0":
                raise ProcessLookupError(errno.ESRCH, os.strerror(errno.ESRCH))
            if proc is not None:
                proc.cgroups[self._mount_of(directory)] = directory
        elif name == "cgroup.kill":
            for proc in self._in(self.cg_walk(directory)):
                self._deliver(proc, signal.SIGKILL)
        else:
            self.files[path] = value
