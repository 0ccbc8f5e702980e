"""What status tells an operator about exposure and a forced stop (issue 11)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from support import PROGRAMS, wait_until

from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.adapters.proc.plan import LaunchPlan, launch_env
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode


def adopted(port: int) -> AdoptedServer:
    spec = InstanceSpec(
        role="ext", flavor=Flavor.LLAMACPP, model="tiny", port=port, mode=Mode.ADOPTED
    )
    return AdoptedServer(spec, probe_timeout_s=1.0)


def test_an_adopted_server_seen_on_loopback_only_is_not_labelled_lan() -> None:
    server = adopted(18080)
    try:
        assert server.exposure({}).startswith("loopback")
        assert server.exposure({9: ["0.0.0.0"]}).startswith("loopback")
        assert server.exposure({18080: ["0.0.0.0"]}).startswith("lan: listening on 0.0.0.0")
        assert server.exposure(None).startswith("unknown")  # sockets not read yet
    finally:
        server.close()


def test_survivors_name_a_child_that_outlived_its_leader(tmp_path: Path) -> None:
    """The stop record says when a child needed SIGKILL: the reap sees who outlived
    the leader (before, the exit's reason never said so)."""
    plan = LaunchPlan(
        program=sys.executable,
        args=[str(PROGRAMS / "spawns_child.py")],
        env=launch_env(),
        cwd=str(tmp_path),
    )
    proc = ManagedProcess.spawn(plan, lambda _info: None)
    try:
        child = wait_until(lambda: _child_pid(proc.output()[0]), 20, "the child to start")
        assert proc.survivors() == []  # the leader has not exited
        os.kill(proc.identity.pid, signal.SIGTERM)  # the leader dies; its child ignores it
        assert proc.wait_exit(10) is not None
        assert proc.survivors() == [child]
    finally:
        proc.kill_tree()
    assert proc.survivors() == []  # nothing of the group is left after the reap


def _child_pid(stdout: str) -> int | None:
    for line in stdout.splitlines():
        if line.startswith("child "):
            return int(line.split()[1])
    return None
