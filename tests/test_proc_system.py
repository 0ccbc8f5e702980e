"""adapters.proc.system and adapters.proc.fake: the operating-system seam.

One contract, run against the machine (real processes, the real cgroup v2
hierarchy, the v1 freezer and memory controllers, the process-group fallback)
and against the in-memory fake beside it; then the termination escalation
(SIGTERM, the grace, cgroup.kill or SIGKILL) on the fake, where a grace of
30 s costs no real time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import wait_until

from infervisor.adapters.proc.cgroups import InstanceCgroup
from infervisor.adapters.proc.containment import Containment, detect
from infervisor.adapters.proc.descendants import Descendants
from infervisor.adapters.proc.fake import FakeSystem
from infervisor.adapters.proc.identity import ProcessIdentity, boot_id
from infervisor.adapters.proc.mounts import Hierarchy
from infervisor.adapters.proc.system import REAL, Child, Spawn, System
from infervisor.adapters.proc.tree import ServerTree

DEADLINE = 10.0  # s a real process is given to start or die

# A real test process: ignores SIGTERM when asked, forks a child in its group
# when asked, says "ready" and waits.
_SCRIPT = """
import os, signal, sys, time
if "ignore" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *a: None)
if "child" in sys.argv and os.fork() == 0:
    while True:
        time.sleep(1)
print("ready", flush=True)
while True:
    time.sleep(1)
"""

Make = Callable[..., int]  # (ignore=, child=, env=, cgroup=) -> the leader's pid


@pytest.fixture
def real(tmp_path: Path) -> Iterator[tuple[System, Make]]:
    started: list[Child] = []

    def make(
        *, ignore: bool = False, child: bool = False, env: dict[str, str] | None = None
    ) -> int:
        args = [a for a, on in (("ignore", ignore), ("child", child)) if on]
        proc = REAL.spawn(Spawn([sys.executable, "-c", _SCRIPT, *args], env or {}, str(tmp_path)))
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        return proc.pid

    yield REAL, make
    for proc in started:
        for pid in [proc.pid, *REAL.children(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(DEADLINE)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


_FAKE_MOUNTS = ("/cg2", "/cg1/freezer", "/cg1/memory")


@pytest.fixture
def fake() -> tuple[System, Make]:
    system = FakeSystem(mounts=_FAKE_MOUNTS)

    def make(
        *, ignore: bool = False, child: bool = False, env: dict[str, str] | None = None
    ) -> int:
        leader = system.start(env=env, ignores=[signal.SIGTERM] if ignore else [])
        if child:
            system.fork(leader.pid)
        return leader.pid

    return system, make


@pytest.fixture(params=["real", "fake"])
def backend(request: pytest.FixtureRequest) -> tuple[System, Make]:
    found: tuple[System, Make] = request.getfixturevalue(request.param)
    return found


def dead(system: System, pid: int) -> Callable[[], bool]:
    return lambda: not system.is_live(pid)


# ---------------------------------------------------------------- the contract


def test_a_process_is_found_by_pid_start_time_and_group(backend) -> None:
    system, make = backend
    pid = make(child=True)
    started = system.start_time(pid)
    assert started is not None
    assert system.is_live(pid)
    assert system.pgid(pid) == pid  # a new session: it leads its own group
    members = system.group_members(pid)
    assert pid in members
    assert len(members) == 2  # and its child
    kids = system.children(pid)
    assert set(kids) == set(members) - {pid}
    assert system.table().descendants(pid) == kids
    assert system.table().is_alive(pid, started)
    assert system.rss_bytes(pid) is not None
    assert system.boot_id() == (boot_id() if system is REAL else "fake-boot")


def test_signal_exact_refuses_another_start_time(backend) -> None:
    system, make = backend
    pid = make()
    started = system.start_time(pid)
    assert started is not None
    assert not system.signal_exact(pid, started + 5.0, signal.SIGKILL)
    assert system.is_live(pid)
    assert system.signal_exact(pid, started, signal.SIGKILL)
    wait_until(dead(system, pid), DEADLINE, "SIGKILL to end it")
    assert system.start_time(2**22 + 7) is None


def test_a_group_ignoring_sigterm_ends_with_sigkill(backend) -> None:
    system, make = backend
    pid = make(ignore=True)
    system.killpg(pid, signal.SIGTERM)
    system.sleep(0.2)
    assert system.is_live(pid)
    system.killpg(pid, signal.SIGKILL)
    wait_until(dead(system, pid), DEADLINE, "SIGKILL to end the group")
    if system is not REAL:  # a real zombie keeps its group until reaped
        with pytest.raises(ProcessLookupError):
            system.killpg(pid, signal.SIGKILL)


def test_carriers_are_found_by_their_environment(backend) -> None:
    system, make = backend
    pid = make(env={"INFERVISOR_LAUNCH_TOKEN": "seam-test-token"})
    found = system.carriers("INFERVISOR_LAUNCH_TOKEN", "seam-test-token")
    assert list(found) == [pid]
    assert system.own_group() not in (0, 1)


# ---------------------------------------------------------------- cgroups


def _available(mode: str) -> bool:
    found = detect(mode, "seam-probe", "/nonexistent-seam-probe")
    found.remove_empty()
    return found.mode == mode


def _real_cgroup(mode: str, tmp_path: Path) -> tuple[Containment, Make]:
    if not _available(mode):
        pytest.skip(f"no {mode} here")
    return detect(mode, "seam", str(tmp_path)), _unused


def _unused(**_: object) -> int:
    raise AssertionError("unused")


_FAKE_HIERARCHIES = {
    "cgroup2": [Hierarchy(2, frozenset(), "/cg2", "/cg2/node")],
    "cgroup1": [
        Hierarchy(1, frozenset({"freezer"}), "/cg1/freezer", "/cg1/freezer/node"),
        Hierarchy(1, frozenset({"memory"}), "/cg1/memory", "/cg1/memory/node"),
    ],
}


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
@pytest.mark.parametrize("where", ["real", "fake"])
def test_a_cgroup_holds_a_tree_and_kills_it(where: str, mode: str, request, tmp_path) -> None:
    """create, move, members, memory reading, kill, remove: the real v2
    hierarchy (cgroup.kill), the real v1 freezer (freeze, SIGKILL, thaw) and
    v1 memory, and the fake's of both."""
    system, make = request.getfixturevalue(where)
    if where == "real":
        containment, _ = _real_cgroup(mode, tmp_path)
    else:
        containment = detect(mode, "seam", str(tmp_path), _FAKE_HIERARCHIES[mode], system)
    assert containment.mode == mode
    cgroup = containment.cgroup("chat-1")
    assert isinstance(cgroup, InstanceCgroup)
    try:
        cgroup.create()
        pid = make(ignore=True, child=True)
        for path in cgroup.server_procs():
            system.cg_write(path, str(pid))
        kid = next(iter(system.children(pid)))
        for path in cgroup.server_procs():
            system.cg_write(path, str(kid))
        assert cgroup.server_members() == {pid, kid}
        assert cgroup.members() == {pid, kid}
        if cgroup.memory is not None:
            assert cgroup.memory_bytes() is not None
        assert containment.instances() == ["chat-1"]
        cgroup.kill()
        assert cgroup.server_members() == set()
        wait_until(dead(system, pid), DEADLINE, "the cgroup's kill")
    finally:
        cgroup.kill(everything=True)
        cgroup.remove()
        containment.remove_empty()
    if where == "fake":  # a real zombie may hold its cgroup until the fixture reaps it
        assert not system.cg_isdir(cgroup.tree)


def test_the_fallback_is_process_groups_where_no_cgroup_can_be_made(fake) -> None:
    system, _ = fake
    assert detect("pgroup", "n", "/d").cgroup("chat-1") is None
    found = detect("auto", "n", "/d", [], system)
    assert found.mode == "pgroup"
    assert "no cgroup v2 hierarchy is mounted" in found.reason
    assert found.cgroup("chat-1") is None


def test_the_real_fallback_when_asked_for(tmp_path: Path) -> None:
    found = detect("pgroup", "seam", str(tmp_path))
    assert (found.mode, found.base, found.cgroup("chat-1")) == ("pgroup", None, None)


# ---------------------------------------------------------------- the escalation, on the fake


def tree_of(
    system: FakeSystem, pgid: int, tmp_path: Path, cgroup: InstanceCgroup | None = None
) -> tuple[ServerTree, Descendants]:
    descendants = Descendants(str(tmp_path), resume=False, system=system)
    at_exit: dict[int, float] | None = None
    return ServerTree(system, pgid, cgroup, descendants, lambda: at_exit), descendants


def test_sigterm_obeyed_leaves_nothing_to_kill(tmp_path: Path) -> None:
    system = FakeSystem()
    leader = system.start()
    system.fork(leader.pid)
    tree, _ = tree_of(system, leader.pid, tmp_path)
    tree.sigterm()
    assert not tree.left()
    assert system.sent == [("group", leader.pid, signal.SIGTERM)]
    tree.kill_all()  # safe once everything has exited
    assert system.sent == [("group", leader.pid, signal.SIGTERM)]


def test_a_server_ignoring_sigterm_keeps_running_through_the_grace_then_is_killed(
    tmp_path: Path,
) -> None:
    system = FakeSystem()
    leader = system.start(ignores=[signal.SIGTERM])
    tree, _ = tree_of(system, leader.pid, tmp_path)
    tree.sigterm()
    tree.settle(30.0)  # the fake clock moves; no real wait
    assert system.now >= 30.0
    assert system.is_live(leader.pid)
    tree.kill_all()
    assert not system.is_live(leader.pid)
    assert system.ended[leader.pid] == (None, signal.SIGKILL)
    assert [s for _, _, s in system.sent] == [signal.SIGTERM, signal.SIGKILL]


def test_settle_returns_once_a_slow_tree_has_ended(tmp_path: Path) -> None:
    system = FakeSystem()
    leader = system.start(term_delay=4.0)
    tree, _ = tree_of(system, leader.pid, tmp_path)
    tree.sigterm()
    tree.settle(30.0)
    assert 4.0 <= system.now < 30.0
    assert system.ended[leader.pid] == (None, signal.SIGTERM)


@pytest.mark.parametrize("mode", ["cgroup2", "cgroup1"])
def test_a_setsid_daemon_is_asked_then_killed_through_the_cgroup(mode: str, tmp_path: Path) -> None:
    system = FakeSystem(mounts=_FAKE_MOUNTS)
    containment = detect(mode, "n", str(tmp_path), _FAKE_HIERARCHIES[mode], system)
    cgroup = containment.cgroup("chat-1")
    assert cgroup is not None
    cgroup.create()
    server = os.path.join(cgroup.tree, "server")
    leader = system.start(cgroup=server)
    daemon = system.fork(leader.pid, setsid=True, ignores=[signal.SIGTERM])
    tree, _ = tree_of(system, leader.pid, tmp_path, cgroup)
    tree.sigterm()
    assert ("pid", daemon.pid, signal.SIGTERM) in system.sent  # outside the group, in the cgroup
    assert tree.left()
    tree.kill_all()
    assert not system.is_live(daemon.pid)
    killed_by = [p for p, _ in system.writes if p.endswith(("cgroup.kill", "freezer.state"))]
    assert killed_by, "the cgroup's own kill was used"
    assert tree.survivors(leader.pid) == []


def test_a_tracked_descendant_that_left_the_group_is_killed(tmp_path: Path) -> None:
    system = FakeSystem()
    leader = system.start()
    middle = system.fork(leader.pid)
    escaped = system.fork(middle.pid, setsid=True, ignores=[signal.SIGTERM])
    tree, descendants = tree_of(system, leader.pid, tmp_path)
    identity = _identity(system, leader.pid)
    descendants.track(identity)
    system.exit(middle.pid)  # orphaned: no longer linked to the server
    assert escaped.pid in descendants.known()
    tree.sigterm()
    tree.kill_all()
    assert not system.is_live(escaped.pid)


def test_a_reused_group_id_is_never_signalled(tmp_path: Path) -> None:
    system = FakeSystem()
    leader = system.start()
    seen = {leader.pid: leader.started}
    descendants = Descendants(str(tmp_path), resume=False, system=system)
    tree = ServerTree(system, leader.pid, None, descendants, lambda: seen)
    system.exit(leader.pid)
    stranger = system.start(pgid=leader.pid)  # the id came back with a new process
    system.sent.clear()
    tree.sigterm()
    tree.kill_all()
    assert system.sent == []
    assert system.is_live(stranger.pid)


def _identity(system: FakeSystem, pid: int) -> ProcessIdentity:
    started = system.start_time(pid)
    assert started is not None
    return ProcessIdentity(pid, pid, started, system.boot_id())


def test_memory_limit_usage_and_oom_kills_are_read_from_the_cgroup(tmp_path: Path) -> None:
    system = FakeSystem(mounts=_FAKE_MOUNTS)
    containment = detect("cgroup1", "n", str(tmp_path), _FAKE_HIERARCHIES["cgroup1"], system)
    cgroup = containment.cgroup("chat-1", memory_max=1 << 30)
    assert cgroup is not None
    assert cgroup.memory is not None
    cgroup.create()
    server = os.path.join(cgroup.memory, "server")
    assert (os.path.join(server, "memory.limit_in_bytes"), str(1 << 30)) in system.writes
    system.start(rss=4096, cgroup=server)
    assert cgroup.memory_bytes() == 4096
    assert not cgroup.oom_kills()
    system.oom(server, 2)
    assert cgroup.oom_kills() == 2
