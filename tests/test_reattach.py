"""A server outlives the node that spawned it (SIGKILL) and a new node re-attaches.

A stand-in node (tests/programs/spawn_and_report.py) spawns the server with
ManagedProcess.spawn and is then SIGKILLed, so the server is reparented to
init: it is no child of the test, and the autouse leftover check cannot see it.
Every server such a test starts is therefore terminated in teardown by identity.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
from support import (
    PROGRAMS,
    Exits,
    gone,
    kill_exact,
    printed_pid,
    script_plan,
    stand_in_node,
    stop,
    wait_until,
)

from infervisor.adapters.proc import pidfd
from infervisor.adapters.proc.descendants import RECORD
from infervisor.adapters.proc.handles import AttachedProcess, ManagedProcess
from infervisor.adapters.proc.identity import ProcessIdentity, find_process
from infervisor.adapters.proc.output import STDOUT_LOG
from infervisor.adapters.proc.pgroup import group_members, kill_identity

DEADLINE = 60.0  # s any condition below is given to come true (generous at load 10)


def last_tick(text: str) -> int:
    ticks = re.findall(r"^tick (\d+)$", text, re.MULTILINE)
    return int(ticks[-1]) if ticks else -1


@pytest.fixture
def orphaned(tmp_path: Path) -> Iterator[Callable[..., ProcessIdentity]]:
    """Spawn a program from a stand-in node, wait for its first output (and for
    ``until()`` if given), SIGKILL that node, return the server's identity."""
    left: list[ProcessIdentity] = []

    def orphan(script: str, until: Callable[[], object] = lambda: True) -> ProcessIdentity:
        node, identity = stand_in_node(
            *(sys.executable, str(PROGRAMS / "spawn_and_report.py"), str(tmp_path)),
            *(sys.executable, str(PROGRAMS / script)),
        )
        left.append(identity)
        wait_until(lambda: (tmp_path / STDOUT_LOG).stat().st_size, what="the server's first line")
        wait_until(until, what="the server to be ready to orphan")
        node.kill()
        node.wait()
        return identity

    yield orphan
    for identity in left:
        kill_identity(identity)
        wait_until(lambda i=identity: find_process(i) is None, what="the orphan to be gone")


def test_server_keeps_logging_after_its_node_is_killed_and_is_reattached(
    orphaned, tmp_path: Path
) -> None:
    identity = orphaned("chatty.py")
    log = tmp_path / STDOUT_LOG
    seen = last_tick(log.read_text())
    wait_until(lambda: last_tick(log.read_text()) > seen + 3, what="ticks with no node alive")
    assert find_process(identity) is not None

    exits = Exits(DEADLINE)
    proc = AttachedProcess.attach(identity, str(tmp_path), exits)
    assert proc is not None
    assert proc.identity == identity
    # What was written before the attach is read too (the readers run on threads).
    wait_until(lambda: proc.output()[1] == "started\n", what="the earlier output")
    at_attach = last_tick(proc.output()[0])
    wait_until(lambda: last_tick(proc.output()[0]) > at_attach + 3, what="the output to grow")
    assert proc.exit_info() is None

    info = stop(proc, DEADLINE)
    assert (info.pid, info.exit_code, info.signal) == (identity.pid, None, None)
    assert info.output_tail.endswith(f"tick {last_tick(proc.output()[0])}\nstarted\n")
    assert proc.kill_tree() == info
    assert exits.calls == [info]
    assert find_process(identity) is None
    assert group_members(identity.pgid) == []


def test_on_exit_fires_once_when_an_attached_server_is_killed_from_outside(
    orphaned, tmp_path: Path
) -> None:
    identity = orphaned("chatty.py")
    exits = Exits(DEADLINE)
    proc = AttachedProcess.attach(identity, str(tmp_path), exits)
    assert proc is not None
    os.kill(identity.pid, signal.SIGKILL)
    info = exits.wait()
    assert (info.exit_code, info.signal) == (None, None)
    assert "tick" in info.output_tail
    assert proc.wait_exit(0.0) == info
    assert proc.kill_tree() == info
    assert exits.calls == [info]


def test_attach_refuses_a_reused_pid_and_a_gone_one(tmp_path: Path) -> None:
    exits = Exits(DEADLINE)
    server = ManagedProcess.spawn(script_plan("ignore_sigterm.py", cwd=tmp_path), exits)
    try:
        ident = server.identity
        reused = ProcessIdentity(ident.pid, ident.pgid, ident.start_time + 5.0, ident.boot_id)
        assert AttachedProcess.attach(reused, str(tmp_path), print) is None
        other_boot = ProcessIdentity(ident.pid, ident.pgid, ident.start_time, "another-boot")
        assert AttachedProcess.attach(other_boot, str(tmp_path), print) is None
        assert server.exit_info() is None  # nothing was signalled
    finally:
        server.kill_tree()
    exits.wait()
    assert AttachedProcess.attach(server.identity, str(tmp_path), print) is None


def test_attach_without_pidfds_waits_through_psutil(
    orphaned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pidfd, "_pidfd_open", lambda pid: None)  # as on macOS or Linux < 5.3
    identity = orphaned("chatty.py")
    exits = Exits(DEADLINE)
    proc = AttachedProcess.attach(identity, str(tmp_path), exits)
    assert proc is not None
    info = stop(proc, DEADLINE)
    assert exits.calls == [info]
    assert find_process(identity) is None


def recorded(tmp_path: Path) -> dict[int, float]:
    try:
        data = msgspec.json.decode((tmp_path / RECORD).read_bytes())
    except (OSError, msgspec.DecodeError):
        return {}
    return {int(pid): started for pid, started in data["known"].items()}


def test_descendants_recorded_by_the_dead_node_are_terminated(orphaned, tmp_path: Path) -> None:
    log = tmp_path / STDOUT_LOG

    def grandchild_recorded() -> bool:
        pid = printed_pid(log.read_text(), "grandchild")
        return pid is not None and pid in recorded(tmp_path)

    # The stand-in node tracks descendants every 50 ms; it dies once it has seen the grandchild.
    identity = orphaned("escaping_child.py", until=grandchild_recorded)
    grandchild, intermediate = (
        printed_pid(log.read_text(), "grandchild"),
        printed_pid(log.read_text(), "intermediate"),
    )
    assert grandchild is not None
    assert intermediate is not None
    started = recorded(tmp_path)[grandchild]
    try:
        (tmp_path / "release").touch()
        wait_until(lambda: psutil.Process(grandchild).ppid() != intermediate, what="orphaning")
        exits = Exits(DEADLINE)
        proc = AttachedProcess.attach(identity, str(tmp_path), exits)
        assert proc is not None
        assert grandchild in proc.descendants()
        stop(proc, DEADLINE)
        assert gone(grandchild, started)
        assert exits.calls == [proc.exit_info()]
    finally:
        kill_exact(grandchild, started)
