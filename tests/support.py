"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import psutil
import pytest

import infervisor.adapters.ports as ports
from infervisor.adapters.proc.handles import ServerProcess
from infervisor.adapters.proc.identity import ProcessIdentity, same_process
from infervisor.adapters.proc.pidfd import PidHandle
from infervisor.adapters.proc.plan import LaunchPlan, launch_env
from infervisor.adapters.proc.waiter import ExitInfo
from infervisor.adapters.procnet import listening_sockets, socket_owners

PROGRAMS = Path(__file__).parent / "programs"
OLLAMA_SERVER = Path(__file__).parent / "servers" / "ollama_server.py"
VERIFIER = Path(__file__).with_name("independent_verifier.py")


#: An in-process crash (the node's actors dropped as a SIGKILL would drop them)
#: leaves the sockets they held unclosed, and their garbage collection warns,
#: on whatever thread it happens. Only modules that simulate a crash that way
#: ignore exactly that warning (``pytestmark = CRASH_LEAVES_SOCKETS``).
CRASH_LEAVES_SOCKETS = [
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket:pytest.PytestUnraisableExceptionWarning"
    ),
]

#: A valid GGUF header (version 3, no tensors, no metadata): what a fake model
#: starts with, since the registry checks the header (adapters/gguf_check.py).
FAKE_GGUF = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)


#: (seq, ts_ns, kind, subject, payload) of one event, as :func:`chain_rows` reads it.
ChainRow = tuple[int, int, str, str, dict[str, Any]]


def chain_rows(db: Path) -> list[ChainRow]:
    """(seq, ts_ns, kind, subject, payload) of every event, read with sqlite3 read-only."""
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            found = con.execute(
                "SELECT seq, ts_ns, kind, subject, payload FROM events ORDER BY seq"
            ).fetchall()
    except sqlite3.OperationalError:
        return []  # not created yet
    return [(q, t, k, subj or "", json.loads(bytes(p))) for q, t, k, subj, p in found]


def gguf_registry(directory: Path, weights: bytes) -> Path:
    """A registry folder ``directory/models`` holding ``tiny.gguf`` with ``weights``."""
    root = directory / "models"
    root.mkdir()
    (root / "tiny.gguf").write_bytes(weights)
    return root


def stand_in_node(*argv: str) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """Start a stand-in node (``argv``: a program of tests/programs/ and what it spawns)
    and read the spawned server's identity, the first line it prints."""
    node = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert node.stdout is not None
    line = node.stdout.readline()
    node.stdout.close()
    return node, msgspec.json.decode(line, type=ProcessIdentity)


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def make_launcher(directory: Path, script: Path, *extra: str) -> str:
    """An executable that execs ``python script extra... "$@"`` (the pid stays the same)."""
    path = directory / f"launch-{script.stem}"
    args = " ".join(f"'{a}'" for a in extra)
    path.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{script}' {args} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def listening_owners(port: int) -> list[int | None]:
    """One entry per TCP socket LISTENing on ``port`` (any address, loopback
    included): the pid holding it, None when no readable process does. What
    ``psutil.net_connections`` lists, read from the kernel's LISTEN table with
    owners looked up for this port only (no scan of every process's
    descriptors for every socket of the machine)."""
    found = [s for s in listening_sockets() if s.port == port]
    owners = socket_owners({s.inode for s in found})
    return [owners.get(s.inode) for s in found]


def listening_pids(port: int) -> set[int]:
    """The pids holding a TCP socket LISTENing on ``port`` (:func:`listening_owners`)."""
    return {pid for pid in listening_owners(port) if pid is not None}


def pids_of_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group.

    On Linux read from each /proc/PID/stat's state and pgrp fields, one read a
    process (about a third of psutil's cost: tests poll this); elsewhere psutil.
    """
    if os.path.isdir("/proc/self/task"):
        return _pids_of_group_proc(pgid)
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return found


def _pids_of_group_proc(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as info:
                fields = info.read().rpartition(b")")[2].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(name))
    return found


def gone(pid: int, started: float) -> bool:
    """The process (pid and start time) has exited (a zombie counts as exited)."""
    proc = same_process(pid, started)
    try:
        return proc is None or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_exact(pid: int, started: float) -> None:
    """SIGKILL the process (pid and start time) if it is still that process."""
    handle = PidHandle.open(pid, started)
    if handle is not None:
        handle.send(signal.SIGKILL)
        handle.close()


def printed_pid(text: str, label: str) -> int | None:
    """The pid a test program printed as a line ``LABEL PID``, or None before it has."""
    found = re.search(rf"^{label} (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def script_plan(
    script: str, *args: str, cwd: Path, env: dict[str, str] | None = None, **kw: int
) -> LaunchPlan:
    """A plan running ``tests/programs/SCRIPT args`` with this Python in ``cwd``."""
    return LaunchPlan(
        program=sys.executable,
        args=[str(PROGRAMS / script), *args],
        env=env if env is not None else launch_env(),
        cwd=str(cwd),
        **kw,
    )


def stop(proc: ServerProcess, grace: float) -> ExitInfo:
    """Stop ``proc`` as the node does (``EffectRunner.terminate``, then ``kill``):
    track its descendants and SIGTERM it now, up to ``grace`` seconds for the
    leader to exit (the decision core's ``kill`` timer), then SIGKILL whatever is
    left of its tree; how it ended."""
    proc.track_descendants()
    proc.sigterm()
    proc.wait_exit(grace)
    return proc.kill_tree()


class Exits:
    """Collects on_exit calls; :meth:`wait` gives the first within ``deadline`` seconds."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.calls: list[ExitInfo] = []
        self.event = threading.Event()

    def __call__(self, info: ExitInfo) -> None:
        self.calls.append(info)
        self.event.set()

    def wait(self) -> ExitInfo:
        assert self.event.wait(self.deadline), "on_exit was not called"
        return self.calls[0]


def run_tool(module: str, *args: str) -> str:
    """Run ``python -m infervisor.tools.MODULE ARGS``, which must succeed; its stdout, stripped."""
    done = subprocess.run(
        [sys.executable, "-m", f"infervisor.tools.{module}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def cli_here(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``infervisor ARGS`` in this process, as the console script runs it
    (``tools/cli.py`` ``main``: the click group in standalone mode), with click's
    CliRunner: its exit status, stdout and stderr, in the shape ``subprocess.run``
    gives. An exception the command does not handle ends it as the interpreter
    would: status 1 and the traceback on stderr (callers check for "Traceback").
    ``env`` sets those environment variables for the command only (CliRunner
    restores them after).

    For commands whose answer does not depend on a process of their own (bad
    flags, refusals, chain readers): a CLI process costs about 0.4 s of CPU to
    start, and the suite is CPU-bound. Tests that check the console script, a
    terminal or signals run the real process (``test_run_resume.cli``).
    """
    from click.testing import CliRunner

    from infervisor.tools.cli import cli

    argv = [str(a) for a in args]
    result = CliRunner().invoke(cli, argv, prog_name="infervisor", env=env)
    code, stderr = result.exit_code, result.stderr
    error = result.exception
    if error is not None and not isinstance(error, SystemExit):
        code = 1
        stderr += "".join(traceback.format_exception(error))
    return subprocess.CompletedProcess(["infervisor", *argv], code, result.stdout, stderr)


def load_independent_verifier() -> ModuleType:
    """Import tests/independent_verifier.py in-process (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("independent_verifier", VERIFIER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class OllamaTestServer:
    """A running tests/servers/ollama_server.py: its URL, port and process."""

    url: str
    port: int
    proc: subprocess.Popen[str]

    def kill(self) -> None:
        """End it now and reap it (idempotent): Ollama is gone."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def ollama_server(*models: str, port: int = 0, **flags: Any) -> Iterator[OllamaTestServer]:
    """Run the Ollama test server with ``--models`` and ``--flag value`` options
    (a list or tuple value repeats the flag: ``fail_load=["a", "b"]``; True gives a
    switch alone: ``fail_completions=True``); killed on exit.

    ``port`` 0 lets the kernel pick one, read back from the server's ``PORT n`` line.
    """
    argv = [sys.executable, str(OLLAMA_SERVER), "--port", str(port), "--models", ",".join(models)]
    for flag, values in flags.items():
        for value in values if isinstance(values, list | tuple) else [values]:
            if value is True:  # a switch: ``fail_completions=True``
                argv.append(f"--{flag.replace('_', '-')}")
            else:
                argv += [f"--{flag.replace('_', '-')}", str(value)]
    server = OllamaTestServer("", port, subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    try:
        assert server.proc.stdout is not None
        line = server.proc.stdout.readline()
        words = line.split()
        assert len(words) == 2 and words[0] == "PORT", f"ollama_server did not start: {line!r}"
        assert port in (0, int(words[1])), f"ollama_server listens on {words[1]}, not {port}"
        server.port = int(words[1])
        server.url = f"http://127.0.0.1:{server.port}"
        yield server
    finally:
        server.kill()


class OwnServer:
    """A server a test starts itself, in a session of its own, as somebody else
    would: the node never started it. Output goes to ``server.log`` in ``cwd``."""

    def __init__(
        self, argv: list[str], *, cwd: Path, port: int, env: dict[str, str] | None = None
    ) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = cwd / "server.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        """Running and not a zombie (psutil's view, as a node would see it)."""
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        """Fail at once, with its output, when the server has exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"{self.proc.args} exited {self.proc.returncode}:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL its whole session's group and reap it (idempotent)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(30)


@contextlib.contextmanager
def own_server(
    argv: list[str], *, cwd: Path, port: int, env: dict[str, str] | None = None
) -> Iterator[OwnServer]:
    """Start :class:`OwnServer`; its group is killed on exit, whatever happened."""
    cwd.mkdir(parents=True, exist_ok=True)
    server = OwnServer(argv, cwd=cwd, port=port, env=env)
    try:
        yield server
    finally:
        server.kill()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now, from this worker's band
    (tests/port_once.py): never the kernel's ephemeral ports, which another worker's
    outgoing connection can take before the server binds one ("127.0.0.1:P is already
    taken by something else", as CI saw)."""
    return [ports.free_port(host) for _ in range(count)]


def managed_fakes_running(
    node: Any, clock: Any, count: int, role: str, timeout: float = 60.0
) -> list[str]:
    """Place ``count`` managed fake llama instances (model "tiny", distinct ports),
    start them, and advance the manual ``clock`` a health interval at a time (each
    once they are settled) until all run; their ids."""
    from infervisor.adapters.spec import Flavor, InstanceSpec

    iids = [
        node.place(InstanceSpec(role=f"{role}{i}", flavor=Flavor.LLAMACPP, model="tiny", port=p))
        for i, p in enumerate(free_ports(count))
    ]
    for iid in iids:
        node.start(iid)

    def all_running() -> bool:
        if all(node.settled(i) for i in iids):
            if all(node.status(i).lifecycle == "running" for i in iids):
                return True
            clock.advance(node.settings.health_interval_s)
        return False

    wait_until(all_running, timeout, f"{count} instances running")
    return iids


def probe_record(script: str, *args: str, cwd: Path) -> Any:
    """Run ``python -c script ARGS`` in a fresh process in ``cwd``: the JSON object
    its last line on stderr holds (what a probe script reports of the process)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return json.loads(done.stderr.strip().splitlines()[-1])
