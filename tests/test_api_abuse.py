"""The control API under abuse (issue 17): pre-auth TCP connections by the
thousand while a managed server is SIGKILLed.

A real ``infervisor run`` with one managed fake llama server, a TCP listener
and a 1 s read deadline. The test opens connections that send nothing or
half a request head and holds them, kills the server meanwhile, and then
waits on the chain: the exit is recorded, a restart is scheduled and a new
server runs; ``infervisor status`` answers over the Unix socket; the node's
descriptors stay within the listeners' caps; and the node itself closes the
held connections (408 after the read deadline, or 503 when shed for a newer
one). Every client socket is closed with SO_LINGER 0 (a reset, no TIME_WAIT),
so the test leaves no ephemeral ports behind on a shared machine.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import http.client
import json
import os
import resource
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from test_run_resume import (
    NodeRun,
    by_role,
    cli,
    end_runs,
    events_of,
    lifecycle,
    put_model,
    write_config,
)

from infervisor.adapters.ports import free_port
from infervisor.replay import NodeState
from infervisor.tools.api.limits import ACCEPT_BATCH
from infervisor.tools.api.serving.server import socket_path

DEADLINE_S = 60.0  # real processes on a loaded machine: generous
#: The node's read deadline in this test (seconds).
READ_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 256
#: Descriptors the node may hold beside its two listeners' caps: connections accepted
#: and not looked at yet (a few accept batches), the chain, logs, pipes, ...
NODE_MARGIN = 4 * ACCEPT_BATCH + 128
PARTIAL_HEAD = b"GET /v1/node HTTP/1.1\r\nHost: node\r\n"  # no blank line: never complete
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets


@dataclass
class Abuse:
    """The node under test: its run, data directory, TCP port and chat server's pid."""

    run: NodeRun
    data: Path
    port: int
    first_pid: int = 0
    fd_peak: int = 0
    replies: collections.Counter[bytes] = field(default_factory=collections.Counter)

    @property
    def db(self) -> Path:
        return self.data / "chain.db"

    def sample_fds(self) -> None:
        """Note the node's open descriptors (its peak is checked against the caps)."""
        with contextlib.suppress(FileNotFoundError):
            self.fd_peak = max(self.fd_peak, len(os.listdir(f"/proc/{self.run.proc.pid}/fd")))


@pytest.fixture
def abuse(tmp_path: Path, fake_llama: str) -> Iterator[Abuse]:
    put_model(tmp_path / "data")
    port = free_port()
    config = write_config(
        tmp_path,
        fake_llama,
        node_extra="[node.restart]\nbase_s = 0.5\n",
        top_extra=(
            f'[api]\ntcp = "127.0.0.1:{port}"\nread_timeout_s = {READ_TIMEOUT_S}\n'
            f"max_connections = {MAX_CONNECTIONS}\n"
        ),
    )
    run = NodeRun(config, tmp_path / "run.log")
    try:
        found = Abuse(run, tmp_path / "data", port)
        state = run.until_state(
            found.db, "chat running", lambda s: lifecycle(s, "chat") == "running", DEADLINE_S
        )
        process = by_role(state.instances, "chat")[1].process
        assert process is not None
        found.first_pid = process.pid
        yield found
        assert run.stop() == 0, run.output()
        assert "Traceback" not in run.output()
    finally:
        end_runs([run], tmp_path / "data" / "chain.db")


def raise_own_descriptor_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}; this test needs {wanted}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def pre_auth(port: int, n: int, *, wait: bool = False) -> socket.socket | None:
    """A connection attempt to ``port`` (``wait``: until connected, else non-blocking);
    every other one sends half a head once connected (a failed attempt: None)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    sock.settimeout(DEADLINE_S if wait else 0.0)
    err = sock.connect_ex(("127.0.0.1", port))
    if err not in (0, errno.EINPROGRESS):
        sock.close()
        return None
    if n % 2:
        with contextlib.suppress(OSError):  # not connected yet: it sends nothing
            sock.send(PARTIAL_HEAD)
    return sock


def kill_chat_and_wait_for_its_restart(abuse: Abuse) -> None:
    """SIGKILL the chat server; the exit is recorded, a restart scheduled, a new server runs."""
    os.kill(abuse.first_pid, signal.SIGKILL)

    def restarted(s: NodeState) -> bool:
        abuse.sample_fds()
        chat = by_role(s.instances, "chat")[1]
        pid = chat.process.pid if chat.process is not None else abuse.first_pid
        return chat.lifecycle == "running" and pid != abuse.first_pid

    state = abuse.run.until_state(abuse.db, "chat restarted", restarted, DEADLINE_S)
    chat_id = by_role(state.instances, "chat")[0]
    kinds = [e.kind for e in events_of(abuse.db) if e.subject == chat_id]
    after_exit = kinds[len(kinds) - 1 - kinds[::-1].index("instance.exited") :]
    assert "instance.restart_scheduled" in after_exit, kinds
    assert "instance.spawned" in after_exit, kinds


def status_answers(abuse: Abuse) -> None:
    """``infervisor status DATA_DIR`` answers over the Unix socket."""
    done = cli("status", abuse.data, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chat" in done.stdout


def closed_by_node(sock: socket.socket, deadline: float) -> bytes:
    """What the node sent on ``sock`` before closing it (b"" if nothing; fails if open)."""
    sock.setblocking(True)
    got = b""
    while True:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            return got
        except TimeoutError:
            pytest.fail(f"the node kept a pre-auth connection open; it sent {got!r}")
        if not chunk:
            return got
        got += chunk


def check_closed(abuse: Abuse, held: list[socket.socket]) -> None:
    """Every held connection is closed by the node; what each saw is counted."""
    deadline = time.monotonic() + DEADLINE_S
    for sock in held:
        try:
            got = closed_by_node(sock, deadline)
        finally:
            sock.close()
        abuse.replies[got.split(b"\r\n", 1)[0]] += 1
    assert set(abuse.replies) <= {
        b"",
        b"HTTP/1.1 408 Request Timeout",
        b"HTTP/1.1 503 Service Unavailable",
    }, abuse.replies


def check_fds(abuse: Abuse) -> None:
    print(f"node descriptors at most {abuse.fd_peak}; replies {dict(abuse.replies)}")
    assert 0 < abuse.fd_peak <= 2 * MAX_CONNECTIONS + NODE_MARGIN, abuse.fd_peak


class Watch:
    """A watch stream (``GET /v1/events?follow=true``) on the Unix socket, on a thread:
    the kinds of the events it delivered."""

    def __init__(self, data: Path, from_seq: int) -> None:
        self.kinds: list[str] = []
        transport = httpx.HTTPTransport(uds=str(socket_path(data)))
        self.client = httpx.Client(transport=transport, base_url="http://node", timeout=None)
        self.url = f"/v1/events?from_seq={from_seq}&follow=true"
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(httpx.HTTPError), self.client.stream("GET", self.url) as answer:
            for line in answer.iter_lines():
                if line.startswith("data:"):
                    self.kinds.append(json.loads(line[5:])["kind"])

    def saw_a_restart(self) -> bool:
        """An exit, and a spawn after it."""
        kinds = list(self.kinds)
        return (
            "instance.exited" in kinds
            and "instance.spawned" in kinds[kinds.index("instance.exited") :]
        )

    def close(self) -> None:
        self.client.close()
        self.thread.join(DEADLINE_S)


def test_1100_idle_pre_auth_connections_do_not_wedge_a_restart(abuse: Abuse) -> None:
    raise_own_descriptor_limit(1100 + 200)
    # A stream in flight is not cut by the read deadline: it sees the restart.
    watch = Watch(abuse.data, len(events_of(abuse.db)))
    held = [s for n in range(1100) if (s := pre_auth(abuse.port, n, wait=True)) is not None]
    try:
        assert len(held) > 1000, len(held)
        abuse.sample_fds()
        kill_chat_and_wait_for_its_restart(abuse)
        status_answers(abuse)
        check_closed(abuse, held)
        abuse.run.until("the watch stream saw the restart", watch.saw_a_restart, DEADLINE_S)
    finally:
        for sock in held:
            sock.close()
        watch.close()
    # The read deadline closed some; the cap shed the rest (a reply, or none if
    # it went before the client's half head).
    assert abuse.replies[b"HTTP/1.1 408 Request Timeout"] > 0, abuse.replies
    check_fds(abuse)


@dataclass
class Flood:
    """``attempts`` pre-auth connection attempts on a thread, at most ``window`` open."""

    port: int
    attempts: int
    window: int
    made: int = 0
    failed: list[BaseException] = field(default_factory=list)

    def run(self, sample: Callable[[], None]) -> None:
        open_: collections.deque[socket.socket] = collections.deque()
        try:
            for n in range(self.attempts):
                sock = pre_auth(self.port, n)
                if sock is not None:
                    open_.append(sock)
                if len(open_) > self.window:
                    open_.popleft().close()
                self.made = n + 1
                if n % 1000 == 0:
                    sample()
        except BaseException as e:  # reported by the test's thread
            self.failed.append(e)
        finally:
            for sock in open_:
                sock.close()


@pytest.mark.slow
def test_20000_pre_auth_connection_attempts_do_not_wedge_a_restart(abuse: Abuse) -> None:
    flood = Flood(abuse.port, attempts=20_000, window=1000)
    raise_own_descriptor_limit(flood.window + 300)
    thread = threading.Thread(target=flood.run, args=(abuse.sample_fds,), daemon=True)
    thread.start()
    try:
        abuse.run.until("2,000 attempts made", lambda: flood.made >= 2000 or flood.failed)
        kill_chat_and_wait_for_its_restart(abuse)
        status_answers(abuse)
    finally:
        thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"the flood did not end: {flood.made} attempts"
    assert not flood.failed, flood.failed
    assert flood.made == flood.attempts
    # After the flood the TCP listener answers a token's request: it is not wedged.
    assert tcp_node_status(abuse) == 200
    check_fds(abuse)


def tcp_node_status(abuse: Abuse) -> int:
    """The status of ``GET /v1/node`` over TCP with the operator's token."""
    tokens = json.loads((abuse.data / "api-tokens.json").read_text())
    conn = http.client.HTTPConnection("127.0.0.1", abuse.port, timeout=DEADLINE_S)
    try:
        conn.request("GET", "/v1/node", headers={"Authorization": f"Bearer {tokens['operator']}"})
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()
