"""A server whose tree ended with it needs no reaping (issue 22: the exit is
decided at once, without a reap thread nor a process table scan); one whose
child outlived it is reaped as before (adapters/proc/waiter.py ``ended_alone``)."""

from __future__ import annotations

import os
import signal

from support import wait_until
from test_process import spawned  # noqa: F401 - the fixture

from infervisor.adapters.proc.system import REAL


def test_a_server_that_ended_alone_has_nothing_left(spawned) -> None:  # noqa: F811
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
    assert proc.ended_alone() is None  # it runs
    os.kill(proc.identity.pid, signal.SIGKILL)
    info = exits.wait()
    assert proc.ended_alone() == info
    assert REAL.group_members(proc.identity.pgid) == {}  # an empty group, no scan


def test_a_server_whose_child_outlived_it_is_reaped(spawned) -> None:  # noqa: F811
    proc, exits = spawned("spawns_child.py")
    wait_until(
        lambda: "child" in proc.output()[0] and "ready" in proc.output()[0], what="the child"
    )
    child = int(proc.output()[0].split("child ")[1].split()[0])
    os.kill(proc.identity.pid, signal.SIGKILL)
    exits.wait()
    assert proc.ended_alone() is None  # its child is still in its group
    assert proc.survivors() == [child]
    assert list(REAL.group_members(proc.identity.pgid)) == [child]
