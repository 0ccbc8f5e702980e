"""adapters.shim and launch tokens: real exit statuses through the exit-status shim,
launch and exit records, and what recover_launch makes of each at boot.

A stand-in node (tests/programs/shim_node.py) spawns a server through
ManagedProcess.spawn with a token and is then SIGKILLed: its shim (and so the
server) is reparented to init and is no child of the test any more, so the
autouse leftover check cannot see them. Every such launch is ended in teardown
by identity, and its shim is waited for.
"""

from __future__ import annotations

import os
import signal
import subprocess
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
    wait_until,
)

from infervisor.adapters.proc import spawn
from infervisor.adapters.proc.errors import SpawnError
from infervisor.adapters.proc.handles import ManagedProcess
from infervisor.adapters.proc.identity import ProcessIdentity, find_process
from infervisor.adapters.proc.output import STDOUT_LOG
from infervisor.adapters.proc.pgroup import kill_identity
from infervisor.adapters.proc.plan import LaunchPlan
from infervisor.adapters.proc.records import (
    KEEP_LAUNCHES,
    LAUNCH_DIR,
    TOKEN_VAR,
    ExitRecord,
    LaunchRecord,
    launch_files,
    new_token,
    read_exit_record,
    read_exit_status,
    read_launch_record,
)
from infervisor.adapters.proc.recovery import (
    LaunchEnded,
    LaunchNeverStarted,
    LaunchRunning,
    recover_launch,
)

DEADLINE = 60.0  # s any condition below is given to come true (generous at load 10)


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[Callable[..., tuple[ManagedProcess, Exits]]]:
    started: list[ManagedProcess] = []

    def spawn(script: str, *args: str, token: str | None = None) -> tuple[ManagedProcess, Exits]:
        exits = Exits(DEADLINE)
        proc = ManagedProcess.spawn(script_plan(script, *args, cwd=tmp_path), exits, token)
        started.append(proc)
        return proc, exits

    yield spawn
    for proc in started:
        proc.kill_tree()


def carriers(token: str) -> list[psutil.Process]:
    """Live processes whose environment holds the token."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TOKEN_VAR) == token:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def running_in(cwd: Path) -> list[int]:
    """Live (non-zombie) processes whose working directory is ``cwd``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == str(cwd) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def orphaned(tmp_path: Path) -> Iterator[Callable[..., tuple[ProcessIdentity, str]]]:
    """Spawn a program with a fresh token from a stand-in node, wait for its
    "ready", SIGKILL that node; returns the server's identity and the token."""
    tokens: list[str] = []

    def orphan(script: str, *args: str) -> tuple[ProcessIdentity, str]:
        token = new_token()
        tokens.append(token)
        node, identity = stand_in_node(
            *(sys.executable, str(PROGRAMS / "shim_node.py"), str(tmp_path), token),
            *(sys.executable, str(PROGRAMS / script), *args),
        )
        wait_until(lambda: "ready" in (tmp_path / STDOUT_LOG).read_text(), what="the server")
        node.kill()
        node.wait()
        return identity, token

    yield orphan
    for token in tokens:
        launched = read_launch_record(str(tmp_path), token)
        if launched is not None:
            kill_identity(launched.identity())
            wait_until(
                lambda r=launched: gone(r.shim_pid, r.shim_start_time or 0.0),
                what="the orphaned shim to be gone",
            )
        for proc in carriers(token):  # a test that failed half-way
            kill_exact(proc.pid, proc.create_time())


# ---------------------------------------------------------------- real exit statuses


@pytest.mark.parametrize(
    ("script", "args", "status"),
    [
        ("exit_nonzero.py", ("0",), (0, None)),
        ("exit_at_once.py", (), (3, None)),
        ("ignore_sigterm.py", (), (None, signal.SIGKILL)),
    ],
)
def test_exit_status_is_the_real_one(spawned, tmp_path: Path, script, args, status) -> None:
    token = new_token()
    proc, exits = spawned(script, *args, token=token)
    if status[1] is not None:
        wait_until(lambda: "ready" in proc.output()[0], what="the program to start")
        os.kill(proc.identity.pid, signal.SIGKILL)
    info = exits.wait()
    assert (info.exit_code, info.signal) == status
    assert info.pid == proc.identity.pid
    assert read_exit_status(str(tmp_path), token) == status
    record = read_exit_record(str(tmp_path), token)
    assert record is not None
    assert (record.token, record.pid, record.error) == (token, proc.identity.pid, None)
    assert exits.calls == [info]


def test_the_handle_names_the_server_and_the_launch_record_matches_psutil(
    spawned, tmp_path: Path
) -> None:
    token = new_token()
    proc, _ = spawned("ignore_sigterm.py", token=token)
    ident = proc.identity
    server = psutil.Process(ident.pid)
    assert server.ppid() == proc.shim_pid
    assert ident.pgid == ident.pid == os.getpgid(ident.pid) == os.getsid(ident.pid)
    assert os.getpgid(proc.shim_pid) == proc.shim_pid == os.getsid(proc.shim_pid)
    assert abs(ident.start_time - server.create_time()) <= 1.0  # pgroup's _START_SLACK
    assert find_process(ident) is not None
    launched = read_launch_record(str(tmp_path), token)
    assert launched is not None
    assert launched.identity() == ident
    assert launched.shim_pid == proc.shim_pid
    assert launched.shim_start_time is not None
    assert abs(launched.shim_start_time - psutil.Process(proc.shim_pid).create_time()) <= 1.0
    raw = msgspec.json.decode(Path(launch_files(str(tmp_path), token)[0]).read_bytes())
    assert set(raw) >= {"token", "pid", "pgid", "start_time", "boot_id", "shim_pid"}


def test_the_token_is_in_the_environ_of_the_server_and_the_shim(spawned) -> None:
    token = new_token()
    proc, _ = spawned("ignore_sigterm.py", token=token)
    assert psutil.Process(proc.identity.pid).environ()[TOKEN_VAR] == token
    assert psutil.Process(proc.shim_pid).environ()[TOKEN_VAR] == token
    assert sorted(p.pid for p in carriers(token)) == sorted([proc.shim_pid, proc.identity.pid])


def test_without_a_token_the_servers_environment_is_the_plans(spawned) -> None:
    proc, _ = spawned("ignore_sigterm.py")
    assert TOKEN_VAR not in psutil.Process(proc.identity.pid).environ()
    assert psutil.Process(proc.shim_pid).environ()[TOKEN_VAR] == proc.token


def test_the_shim_survives_signals_to_itself_and_to_the_servers_group(spawned) -> None:
    proc, exits = spawned("shim_exit_on_usr1.py", "4", token=new_token())
    wait_until(lambda: "ready" in proc.output()[0], what="the server")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
        os.kill(proc.shim_pid, sig)
    os.killpg(proc.identity.pgid, signal.SIGTERM)  # the server dies of it; its shim does not
    info = exits.wait()
    # Only a live shim can have collected and recorded this status.
    assert (info.exit_code, info.signal) == (None, signal.SIGTERM)


def test_the_server_gets_default_signal_actions_and_exits_by_itself(spawned) -> None:
    proc, exits = spawned("shim_exit_on_usr1.py", "4", token=new_token())
    wait_until(lambda: "ready" in proc.output()[0], what="the server")
    os.kill(proc.identity.pid, signal.SIGUSR1)
    assert (exits.wait().exit_code, exits.wait().signal) == (4, None)


def test_a_killed_shim_leaves_the_exit_unknown_but_reported(spawned, tmp_path: Path) -> None:
    token = new_token()
    proc, exits = spawned("ignore_sigterm.py", token=token)
    wait_until(lambda: "ready" in proc.output()[0], what="the server")
    os.kill(proc.shim_pid, signal.SIGKILL)
    info = proc.kill_tree()
    assert (info.exit_code, info.signal) == (None, None)
    assert exits.calls == [info]
    assert find_process(proc.identity) is None
    ended = recover_launch(str(tmp_path), token, print, wait=0.0)
    assert isinstance(ended, LaunchEnded)
    assert (ended.exit_code, ended.signal, ended.pid) == (None, None, proc.identity.pid)
    assert ended.reason is not None
    assert "no exit status" in ended.reason


# ---------------------------------------------------------------- launch failures


def test_a_missing_program_is_a_spawn_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-server")
    plan = LaunchPlan(program=missing, args=[], env={}, cwd=str(tmp_path))
    with pytest.raises(SpawnError, match=r"cannot start .*no-such-server: no such program \("):
        ManagedProcess.spawn(plan, print, new_token())


def test_an_exec_failure_inside_the_shim_is_a_spawn_error(tmp_path: Path) -> None:
    """Executable, but its interpreter is missing: only exec itself can tell."""
    server = tmp_path / "server.sh"
    server.write_text("#!/no/such/interpreter\n")
    server.chmod(0o755)
    token = new_token()
    plan = LaunchPlan(program=str(server), args=[], env={}, cwd=str(tmp_path))
    with pytest.raises(SpawnError, match=r"cannot start .*server.sh: no such program \(No such"):
        ManagedProcess.spawn(plan, print, token)
    record = read_exit_record(str(tmp_path), token)
    assert record is not None
    assert record.pid is None
    assert record.error is not None
    assert record.error.startswith("no such program")
    assert read_launch_record(str(tmp_path), token) is None
    assert read_exit_status(str(tmp_path), token) == (None, None)
    ended = recover_launch(str(tmp_path), token, print)
    assert isinstance(ended, LaunchEnded)
    assert ended.error == record.error


@pytest.mark.parametrize("explicit", [True, False])
def test_a_shim_that_does_not_report_in_time_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, explicit: bool
) -> None:
    monkeypatch.setattr(spawn, "LAUNCH_REPORT_TIMEOUT", 0.0)
    token = new_token()
    plan = script_plan("ignore_sigterm.py", cwd=tmp_path)
    with pytest.raises(SpawnError, match="did not report within 0 s"):
        ManagedProcess.spawn(plan, print, token if explicit else None)
    assert carriers(token) == []
    assert running_in(tmp_path) == []  # neither the shim nor a server it may have started


def test_a_token_is_used_once(spawned) -> None:
    token = new_token()
    _, exits = spawned("exit_at_once.py", token=token)
    exits.wait()
    with pytest.raises(SpawnError, match="used before"):
        spawned("exit_at_once.py", token=token)
    with pytest.raises(ValueError, match="launch token"):
        spawned("exit_at_once.py", token="../escape")


def test_records_of_old_launches_are_pruned(spawned, tmp_path: Path) -> None:
    tokens = [new_token() for _ in range(KEEP_LAUNCHES + 3)]
    for token in tokens:
        _, exits = spawned("exit_nonzero.py", "0", token=token)
        exits.wait()
    kept = {name.split(".")[0] for name in os.listdir(tmp_path / LAUNCH_DIR)}
    assert tokens[-1] in kept
    assert len(kept) <= KEEP_LAUNCHES + 1
    assert tokens[0] not in kept


# ---------------------------------------------------------------- recovery at boot


def test_a_server_whose_node_died_is_adopted_and_its_exit_status_read(
    orphaned, tmp_path: Path
) -> None:
    identity, token = orphaned("shim_exit_on_usr1.py", "6")
    assert find_process(identity) is not None  # it outlived its node
    exits = Exits(DEADLINE)
    found = recover_launch(str(tmp_path), token, exits)
    assert isinstance(found, LaunchRunning)
    assert found.identity == identity
    assert found.process.identity == identity
    wait_until(lambda: "ready" in found.process.output()[0], what="the earlier output")
    os.kill(identity.pid, signal.SIGUSR1)
    info = exits.wait()
    assert (info.pid, info.exit_code, info.signal) == (identity.pid, 6, None)
    assert exits.calls == [info]


def test_a_server_that_ended_while_no_node_ran_is_reported_with_its_status(
    orphaned, tmp_path: Path
) -> None:
    identity, token = orphaned("shim_exit_on_usr1.py", "7")
    os.kill(identity.pid, signal.SIGUSR1)
    wait_until(lambda: read_exit_status(str(tmp_path), token), what="the exit record")
    ended = recover_launch(str(tmp_path), token, print)
    assert isinstance(ended, LaunchEnded)
    assert (ended.exit_code, ended.signal, ended.error) == (7, None, None)
    assert ended.pid == identity.pid
    assert ended.ended_ns is not None


def test_a_token_never_launched_never_started(tmp_path: Path) -> None:
    found = recover_launch(str(tmp_path), new_token(), print)
    assert isinstance(found, LaunchNeverStarted)
    assert "no process carries it" in found.reason


def test_a_process_carrying_the_token_without_records_is_killed(tmp_path: Path) -> None:
    token = new_token()
    stray = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "ignore_sigterm.py")],
        env={**os.environ, TOKEN_VAR: token},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert stray.stdout is not None
    assert stray.stdout.readline() == b"ready\n"
    stray.stdout.close()
    found = recover_launch(str(tmp_path), token, print, wait=0.2)
    assert isinstance(found, LaunchNeverStarted)
    assert str(stray.pid) in found.reason
    assert "killed" in found.reason
    assert stray.wait(DEADLINE) == -signal.SIGKILL


def test_recovery_records_decode_as_a_tagged_union() -> None:
    ended = LaunchEnded(exit_code=3, signal=None, pid=12)
    data = msgspec.json.encode(ended)
    assert msgspec.json.decode(data, type=LaunchEnded | LaunchNeverStarted) == ended
    assert msgspec.json.decode(b'{"type":"never_started","reason":"x"}', type=LaunchNeverStarted)
    assert ExitRecord(token="t", pid=None, exit_code=None, signal=None, ended_ns=1).error is None
    assert LaunchRecord(token="t", pid=1, pgid=1, start_time=None, boot_id="", shim_pid=2)


# ---------------------------------------------------------------- the subreaper


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
def test_an_escaped_grandchild_is_reparented_to_the_shim(spawned, tmp_path: Path) -> None:
    proc, _ = spawned("escaping_child.py", token=new_token())
    wait_until(lambda: printed_pid(proc.output()[0], "grandchild"), what="the grandchild")
    grandchild = printed_pid(proc.output()[0], "grandchild")
    intermediate = printed_pid(proc.output()[0], "intermediate")
    assert grandchild is not None
    assert intermediate is not None
    started = psutil.Process(grandchild).create_time()
    try:
        (tmp_path / "release").touch()
        wait_until(lambda: psutil.Process(grandchild).ppid() != intermediate, what="the orphaning")
        assert psutil.Process(grandchild).ppid() == proc.shim_pid
    finally:
        kill_exact(grandchild, started)
    wait_until(lambda: gone(grandchild, started), what="the grandchild to be gone")
