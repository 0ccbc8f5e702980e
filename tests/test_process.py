"""adapters.process: spawning, output capture, exit reports, group termination."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from infervisor.adapters.errors import ProcessControlError, SpawnError
from infervisor.adapters.process import (
    ExitInfo,
    LaunchPlan,
    ManagedProcess,
    ProcessIdentity,
    find_process,
    group_members,
    kill_group,
    launch_env,
    terminate_identity,
    tree_rss_bytes,
)

PROGRAMS = Path(__file__).parent / "programs"
DEADLINE = 10.0  # seconds any condition below is given to come true


def wait_until(pred: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not pred():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def plan(
    script: str, *args: str, cwd: Path, env: dict[str, str] | None = None, **kw: int
) -> LaunchPlan:
    return LaunchPlan(
        program=sys.executable,
        args=[str(PROGRAMS / script), *args],
        env=env if env is not None else launch_env(),
        cwd=str(cwd),
        **kw,
    )


class Exits:
    """Collects on_exit calls."""

    def __init__(self) -> None:
        self.calls: list[ExitInfo] = []
        self.event = threading.Event()

    def __call__(self, info: ExitInfo) -> None:
        self.calls.append(info)
        self.event.set()

    def wait(self) -> ExitInfo:
        assert self.event.wait(DEADLINE), "on_exit was not called"
        return self.calls[0]


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., tuple[ManagedProcess, Exits]]]:
    started: list[ManagedProcess] = []

    def spawn(script: str, *args: str, **kw: object) -> tuple[ManagedProcess, Exits]:
        exits = Exits()
        proc = ManagedProcess.spawn(plan(script, *args, cwd=tmp_path, **kw), exits)  # type: ignore[arg-type]
        started.append(proc)
        return proc, exits

    yield spawn
    for proc in started:
        proc.terminate(0.0)


def test_launch_env_keeps_only_passthrough_and_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERVISOR_SECRET", "leak")
    monkeypatch.setenv("HOME", "/home/x")
    env = launch_env(("HOME", "NOT_SET_ANYWHERE"), {"HOME": "/override", "A": "1"})
    assert env == {"HOME": "/override", "A": "1"}


def test_child_sees_only_the_cleared_environment(spawned, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERVISOR_SECRET", "leak")
    env = launch_env(("PATH",), {"EXTRA": "yes"})
    proc, exits = spawned("print_env.py", env=env)
    assert exits.wait().exit_code == 0
    seen = json.loads(proc.output()[0])
    seen.pop("LC_CTYPE", None)  # Python may set it for itself (PEP 538 locale coercion)
    assert seen == {"PATH": os.environ["PATH"], "EXTRA": "yes"}


def test_on_exit_called_once_with_exit_code_and_tail(spawned) -> None:
    proc, exits = spawned("exit_nonzero.py", "7")
    info = exits.wait()
    assert (info.exit_code, info.signal, info.pid) == (7, None, proc.identity.pid)
    assert "to stdout" in info.output_tail
    assert info.output_tail.rstrip().endswith("to stderr: giving up")
    assert proc.terminate(1.0) == info  # idempotent on an exited process
    assert proc.terminate(1.0) == info
    assert exits.calls == [info]
    assert proc.exit_info() == info


def test_output_capped_with_tail_kept(spawned) -> None:
    proc, exits = spawned("write_bytes.py", "300000", output_limit=1000)
    assert exits.wait().exit_code == 0
    out, err = proc.output()
    assert len(out) == 1000
    assert out.endswith("<END>")
    assert err == "done\n"
    assert proc.dropped_bytes() == (299000, 0)
    assert len(exits.calls[0].output_tail.encode()) <= 4096


def test_sigkill_from_outside_reports_the_signal(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], "the program to start")
    assert proc.exit_info() is None
    assert proc.wait_exit(0.0) is None
    os.kill(proc.identity.pid, signal.SIGKILL)
    info = exits.wait()
    assert (info.exit_code, info.signal) == (None, signal.SIGKILL)


def test_terminate_escalates_to_sigkill_after_grace(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], "SIGTERM to be ignored")
    info = proc.terminate(0.3)
    assert info.signal == signal.SIGKILL
    assert group_members(proc.identity.pgid) == []
    assert exits.calls == [info]


def test_terminate_kills_a_child_in_the_group(spawned) -> None:
    proc, exits = spawned("spawns_child.py")
    wait_until(lambda: "child" in proc.output()[0] and "ready" in proc.output()[0], "the child")
    child = int(proc.output()[0].split("child ")[1].split()[0])
    assert sorted(group_members(proc.identity.pgid)) == sorted([proc.identity.pid, child])
    info = proc.terminate(0.3)
    assert info.signal == signal.SIGTERM  # the leader obeyed; its child needed SIGKILL
    assert group_members(proc.identity.pgid) == []
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert len(exits.calls) == 1


def test_terminate_races_natural_exit(spawned) -> None:
    for _ in range(5):
        proc, exits = spawned("exit_nonzero.py", "0")
        info = proc.terminate(1.0)
        assert exits.wait() == info
        assert len(exits.calls) == 1


def test_process_identity_and_memory(spawned) -> None:
    proc, _ = spawned("ignore_sigterm.py")
    ident = proc.identity
    assert ident.pgid == ident.pid == os.getpgid(ident.pid)
    assert ident.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert (rss := tree_rss_bytes(ident.pid)) is not None
    assert rss > 0
    found = find_process(ident)
    assert found is not None
    assert found.pid == ident.pid


def test_find_process_refuses_a_different_start_time_or_boot(spawned) -> None:
    proc, _ = spawned("ignore_sigterm.py")
    ident = proc.identity
    later = ProcessIdentity(ident.pid, ident.pgid, ident.start_time + 5.0, ident.boot_id)
    assert find_process(later) is None
    assert not terminate_identity(later, 0.0)  # never signals a pid it cannot vouch for
    assert proc.exit_info() is None
    other_boot = ProcessIdentity(ident.pid, ident.pgid, ident.start_time, "not-this-boot")
    assert find_process(other_boot) is None


def test_terminate_identity_stops_a_recognised_group(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], "the program to start")
    assert terminate_identity(proc.identity, 0.2)
    assert exits.wait().signal == signal.SIGKILL
    assert find_process(proc.identity) is None
    assert tree_rss_bytes(proc.identity.pid) is None


def test_spawn_missing_program_names_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-server")
    bad = LaunchPlan(program=missing, args=[], env={}, cwd=str(tmp_path))
    with pytest.raises(SpawnError, match="no-such-server"):
        ManagedProcess.spawn(bad, lambda _: None)


def test_spawn_not_executable_and_bad_cwd(tmp_path: Path) -> None:
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(SpawnError, match="not executable"):
        ManagedProcess.spawn(LaunchPlan(program=str(script), args=[], env={}, cwd="/"), print)
    nowhere = LaunchPlan(program=sys.executable, args=[], env={}, cwd=str(tmp_path / "gone"))
    with pytest.raises(SpawnError, match="working directory"):
        ManagedProcess.spawn(nowhere, print)


def test_kill_group_guards(tmp_path: Path) -> None:
    kill_group(2**22 + 12345, signal.SIGTERM)  # no such group: ignored
    for pgid in (0, 1, os.getpgrp()):
        with pytest.raises(ProcessControlError, match="refusing"):
            kill_group(pgid, signal.SIGTERM)
