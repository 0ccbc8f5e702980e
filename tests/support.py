"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

PROGRAMS = Path(__file__).parent / "programs"
OLLAMA_SERVER = Path(__file__).parent / "servers" / "ollama_server.py"


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
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


def pids_of_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return found


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
    (a list or tuple value repeats the flag: ``fail_load=["a", "b"]``); killed on exit.

    ``port`` 0 lets the kernel pick one, read back from the server's ``PORT n`` line.
    """
    argv = [sys.executable, str(OLLAMA_SERVER), "--port", str(port), "--models", ",".join(models)]
    for flag, values in flags.items():
        for value in values if isinstance(values, list | tuple) else [values]:
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
