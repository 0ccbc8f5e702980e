"""adapters.proc (handles, spawn, pgroup, descendants): spawning, output to log
files, exit reports, group termination, descendants that escape the group."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from support import Exits, gone, kill_exact, printed_pid, script_plan, stop, wait_until

from infervisor.adapters.proc.errors import ProcessControlError, SpawnError
from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.adapters.proc.identity import ProcessIdentity, find_process
from infervisor.adapters.proc.output import STDERR_LOG, STDOUT_LOG, LogReader, Tail
from infervisor.adapters.proc.pgroup import (
    group_members,
    kill_group,
    kill_identity,
    tree_rss_bytes,
)
from infervisor.adapters.proc.pidfd import PidHandle
from infervisor.adapters.proc.plan import LaunchPlan, launch_env

DEADLINE = 60.0  # seconds any condition below is given to come true (generous at load 10)


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., tuple[ManagedProcess, Exits]]]:
    started: list[ManagedProcess] = []

    def spawn(script: str, *args: str, **kw: object) -> tuple[ManagedProcess, Exits]:
        exits = Exits(DEADLINE)
        proc = ManagedProcess.spawn(script_plan(script, *args, cwd=tmp_path, **kw), exits)  # type: ignore[arg-type]
        started.append(proc)
        return proc, exits

    yield spawn
    for proc in started:
        proc.kill_tree()


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
    assert proc.kill_tree() == info  # idempotent on an exited process
    assert proc.kill_tree() == info
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
    wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
    assert proc.exit_info() is None
    assert proc.wait_exit(0.0) is None
    os.kill(proc.identity.pid, signal.SIGKILL)
    info = exits.wait()
    assert (info.exit_code, info.signal) == (None, signal.SIGKILL)


def test_terminate_escalates_to_sigkill_after_grace(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], what="SIGTERM to be ignored")
    info = stop(proc, 0.3)
    assert info.signal == signal.SIGKILL
    assert group_members(proc.identity.pgid) == []
    assert exits.calls == [info]


def test_terminate_kills_a_child_in_the_group(spawned) -> None:
    proc, exits = spawned("spawns_child.py")
    wait_until(
        lambda: "child" in proc.output()[0] and "ready" in proc.output()[0], what="the child"
    )
    child = int(proc.output()[0].split("child ")[1].split()[0])
    assert sorted(group_members(proc.identity.pgid)) == sorted([proc.identity.pid, child])
    info = stop(proc, DEADLINE)
    assert info.signal == signal.SIGTERM  # the leader obeyed; its child needed SIGKILL
    assert group_members(proc.identity.pgid) == []
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert len(exits.calls) == 1


def test_terminate_races_natural_exit(spawned) -> None:
    for _ in range(5):
        proc, exits = spawned("exit_nonzero.py", "0")
        info = stop(proc, 1.0)
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
    assert not kill_identity(later)  # never signals a pid it cannot vouch for
    assert proc.exit_info() is None
    other_boot = ProcessIdentity(ident.pid, ident.pgid, ident.start_time, "not-this-boot")
    assert find_process(other_boot) is None


def test_terminate_identity_stops_a_recognised_group(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
    assert kill_identity(proc.identity)
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


# ---------------------------------------------------------------- output files


def test_output_goes_to_log_files_in_cwd(spawned, tmp_path: Path) -> None:
    proc, exits = spawned("exit_nonzero.py", "7")
    exits.wait()
    assert (tmp_path / STDOUT_LOG).read_text() == "to stdout\n"
    assert (tmp_path / STDERR_LOG).read_text() == "to stderr: giving up\n"
    assert proc.output() == ("to stdout\n", "to stderr: giving up\n")


def test_log_file_capped_on_disk_with_its_tail_saved(spawned, tmp_path: Path) -> None:
    proc, exits = spawned("write_bytes.py", "300000", output_limit=1000)
    exits.wait()
    # The exit report waits for the readers at most _READER_DRAIN (0.5 s): at load
    # the last read and the cut may come after it. Wait for the cut, not a report.
    saved = tmp_path / (STDOUT_LOG + ".earlier")
    wait_until(lambda: saved.exists() and proc.output()[0].endswith("<END>"), DEADLINE, "the cut")
    wait_until(lambda: (tmp_path / STDOUT_LOG).stat().st_size <= 1000, DEADLINE, "the cut log")
    live = (tmp_path / STDOUT_LOG).read_bytes()
    previous = saved.read_bytes()
    assert len(live) <= 1000
    assert len(previous) <= 1000
    assert (previous + live).endswith(b"<END>")
    assert (previous + live)[-1000:].decode() == proc.output()[0]


def test_a_log_read_past_its_limit_is_not_caught_up_until_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that has read a file past its limit to the end, but not yet saved
    its tail and emptied it, is not done: an exit report must wait for it
    (fails before: caught_up() said yes with the cut pending)."""
    log = tmp_path / STDOUT_LOG
    log.write_bytes(b"x" * 2000)
    entered, release = threading.Event(), threading.Event()
    save = LogReader._save_previous

    def held(reader: LogReader) -> None:
        entered.set()
        release.wait(DEADLINE)
        save(reader)

    monkeypatch.setattr(LogReader, "_save_previous", held)
    stop = threading.Event()
    reader = LogReader(str(log), Tail(1000), 1000, stop, resume=False)
    thread = threading.Thread(target=reader.run)
    thread.start()
    try:
        assert entered.wait(DEADLINE)
        assert not reader.caught_up()
    finally:
        release.set()
        stop.set()
        thread.join(DEADLINE)
    assert reader.caught_up()
    assert log.stat().st_size == 0
    assert (tmp_path / (STDOUT_LOG + ".earlier")).read_bytes() == b"x" * 1000


def test_exit_report_ends_with_the_last_lines_printed(spawned) -> None:
    proc, exits = spawned("crash_after_output.py", "5000")
    info = exits.wait()
    assert info.exit_code == 1
    assert "line 4999\n" in info.output_tail
    assert info.output_tail.endswith("RuntimeError: model failed to load: tensor blk.0 missing\n")
    assert proc.output()[1].startswith("Traceback")


def test_a_new_spawn_starts_with_empty_logs_and_keeps_the_earlier_ones(
    spawned, tmp_path: Path
) -> None:
    _, exits = spawned("exit_nonzero.py", "0")
    exits.wait()
    (tmp_path / (STDOUT_LOG + ".1")).write_text("left by an earlier run\n")
    proc, exits = spawned("exit_nonzero.py", "0")
    exits.wait()
    assert proc.output()[0] == "to stdout\n"  # this spawn's own output only
    # The previous spawn's log rotated to .1, what was .1 to .2 (three are kept).
    assert (tmp_path / (STDOUT_LOG + ".1")).read_text() == "to stdout\n"
    assert (tmp_path / (STDOUT_LOG + ".2")).read_text() == "left by an earlier run\n"


# ---------------------------------------------------------------- descendants


@pytest.fixture
def strays() -> Iterator[list[tuple[int, float]]]:
    """Processes that may escape on purpose: SIGKILLed (identity-checked) in teardown."""
    escaped: list[tuple[int, float]] = []
    yield escaped
    for pid, started in escaped:
        kill_exact(pid, started)
    wait_until(lambda: all(gone(*p) for p in escaped), what="the strays to be gone")


def escape(spawned, strays) -> tuple[ManagedProcess, int, tuple[int, float]]:
    """Start escaping_child.py; returns it, the intermediate pid and the grandchild."""
    proc, _ = spawned("escaping_child.py")
    wait_until(lambda: printed_pid(proc.output()[0], "grandchild"), what="the grandchild to report")
    grandchild = printed_pid(proc.output()[0], "grandchild")
    intermediate = printed_pid(proc.output()[0], "intermediate")
    assert grandchild is not None
    assert intermediate is not None
    strays.append((grandchild, psutil.Process(grandchild).create_time()))
    assert os.getsid(grandchild) == grandchild  # out of the server's session and group
    return proc, intermediate, strays[-1]


def release(tmp_path: Path, intermediate: int, grandchild: int) -> None:
    """Let the intermediate exit and wait until the grandchild is orphaned."""
    started = psutil.Process(intermediate).create_time()
    (tmp_path / "release").touch()
    wait_until(lambda: gone(intermediate, started), what="the intermediate to exit")
    assert psutil.Process(grandchild).ppid() != intermediate


def test_track_descendants_sees_a_child_in_the_group(spawned) -> None:
    proc, _ = spawned("spawns_child.py")
    wait_until(lambda: printed_pid(proc.output()[0], "child"), what="the child")
    child = printed_pid(proc.output()[0], "child")
    proc.track_descendants()
    known = proc.descendants()
    assert set(known) == {child}
    assert child is not None
    stop(proc, DEADLINE)
    # stop may already have pruned the child from descendants() once it saw it
    # gone, so its start time is taken before.
    assert gone(child, known[child])


def test_terminate_reaches_an_escaped_grandchild_once_tracked(
    spawned, strays, tmp_path: Path
) -> None:
    proc, intermediate, (grandchild, started) = escape(spawned, strays)
    proc.track_descendants()  # a health tick while the intermediate still links it to us
    assert {intermediate, grandchild} <= set(proc.descendants())
    release(tmp_path, intermediate, grandchild)
    assert grandchild not in group_members(proc.identity.pgid)
    stop(proc, DEADLINE)
    assert gone(grandchild, started)
    assert group_members(proc.identity.pgid) == []


def test_an_escape_never_tracked_is_found_through_its_shim(spawned, strays, tmp_path: Path) -> None:
    """A descendant that left the group and was orphaned before any
    track_descendants() call is re-parented to the shim (a subreaper), so it is
    found as the shim's child and terminate ends it (no cgroup here)."""
    proc, intermediate, (grandchild, started) = escape(spawned, strays)
    release(tmp_path, intermediate, grandchild)
    assert psutil.Process(grandchild).ppid() == proc.shim_pid
    proc.track_descendants()
    assert grandchild in proc.descendants()
    assert proc.identity.pid not in proc.descendants()  # the server is no descendant of itself
    stop(proc, DEADLINE)
    assert group_members(proc.identity.pgid) == []
    assert gone(grandchild, started)


def test_kill_sends_sigkill_to_the_group_at_once(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
    proc.kill()
    assert exits.wait().signal == signal.SIGKILL


def test_a_group_is_recognised_after_its_leader_exit_only_by_an_older_member(spawned) -> None:
    proc, _ = spawned("ignore_sigterm.py")
    wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
    ident = proc.identity
    assert group_members(ident.pgid, at_exit={ident.pid: ident.start_time}) == [ident.pid]
    # None of the processes seen at the exit is left: the id may name another group.
    assert group_members(ident.pgid, at_exit={ident.pid: ident.start_time - 60.0}) == []
    assert group_members(ident.pgid, at_exit={}) == []


def test_pid_handle_refuses_another_start_time_and_reports_a_gone_process(spawned) -> None:
    proc, exits = spawned("ignore_sigterm.py")
    ident = proc.identity
    assert PidHandle.open(ident.pid, ident.start_time + 5.0) is None
    handle = PidHandle.open(ident.pid, ident.start_time)
    assert handle is not None
    assert handle.send(signal.SIGKILL)
    exits.wait()
    handle.wait()  # a reaped process: returns at once
    assert not handle.send(signal.SIGKILL)
    handle.close()
