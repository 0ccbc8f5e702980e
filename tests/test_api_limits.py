"""The control API's connection limits (tools/api/limits.py, connection.py): read
deadlines, the keep-alive timeout, what is shed when a listener is full.

An in-process API server on a Unix socket whose node never opens (every
complete request is answered 503 ``node_starting``: an answer is all these
tests need), with small limits; raw sockets speak HTTP/1.1 to it.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from infervisor.tools.api.limits import ConnectionLimits, Phase
from infervisor.tools.api.serving.server import ApiServer, socket_path
from infervisor.tools.node.config import ConfigError, load_config

DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10
GET = b"GET /v1/node HTTP/1.1\r\nHost: node\r\n\r\n"
#: A stop whose body never finishes: the connection waits in Phase.BODY.
HALF_POST = (
    b"POST /v1/instances/x/stop HTTP/1.1\r\nHost: node\r\n"
    b'Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{"grace_s"'
)

Serve = Callable[..., ApiServer]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """``serve(**limits)``: an API server on tmp_path with those limits (closed after)."""
    servers: list[ApiServer] = []

    def start(**limits: Any) -> ApiServer:
        data = tmp_path / f"data{len(servers)}"
        data.mkdir()
        server = ApiServer.listen(data, data / "chain.db", "n1", limits=ConnectionLimits(**limits))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def connect(
    server: ApiServer, opened: list[socket.socket], send: bytes = b"", *, grows: bool = True
) -> socket.socket:
    """A connection to ``server``'s socket; with ``grows``, counted before this returns
    (else it replaces a shed one: the test waits for that one's close)."""
    before = server.listeners.count("unix")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    opened.append(sock)
    sock.settimeout(DEADLINE_S)
    sock.connect(str(socket_path(server.ctx.data_dir)))
    if send:
        sock.sendall(send)
    if grows:
        wait_until(
            lambda: server.listeners.count("unix") > before, DEADLINE_S, "the connection counted"
        )
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails if it does not)."""
    got = b""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    pytest.fail(f"the server kept the connection open; it sent {got!r}")


def one_answer(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """(status, JSON body) of one answer on a kept-alive connection."""
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(65536)
    head, body = got.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), json.loads(body)


def error_of(answer: bytes) -> tuple[int, str]:
    """(status, error code) of a whole answer ending in the close."""
    head, body = answer.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head.lower(), head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]["code"]


def test_a_connection_that_sends_nothing_gets_408_after_the_read_timeout(
    serve: Serve, sockets: list[socket.socket]
) -> None:
    server = serve(read_timeout_s=0.3)
    silent = connect(server, sockets)
    partial = connect(server, sockets, send=b"GET /v1/node HTTP/1.1\r\nHost: no")
    for sock in (silent, partial):
        assert error_of(until_closed(sock)) == (408, "request_timeout")
    wait_until(lambda: server.listeners.count("unix") == 0, DEADLINE_S, "both forgotten")


def test_a_body_that_misses_the_deadline_gets_408_and_the_close(
    serve: Serve, sockets: list[socket.socket]
) -> None:
    """Nothing runs on part of a body; the caller is told why (a trial, stop 35: the
    connection was closed unanswered). One whose answer has begun is only closed."""
    server = serve(read_timeout_s=0.3)
    sock = connect(server, sockets, send=HALF_POST)
    answer = until_closed(sock)
    assert error_of(answer) == (408, "request_timeout")
    assert b"request body did not arrive within 0.3 s (api.read_timeout_s)" in answer
    # a GET answered (503: the node never opens here) before its announced body came
    answered = connect(
        server, sockets, send=GET.replace(b"\r\n\r\n", b"\r\nContent-Length: 9\r\n\r\n")
    )
    answer = until_closed(answered)
    assert answer.startswith(b"HTTP/1.1 503 ") and answer.count(b"HTTP/1.1") == 1, answer


def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_s(
    serve: Serve, sockets: list[socket.socket]
) -> None:
    server = serve(keep_alive_s=0.3, read_timeout_s=60.0)
    sock = connect(server, sockets, send=GET)
    status, body = one_answer(sock)
    assert (status, body["error"]["code"]) == (503, "node_starting")  # type: ignore[index]
    assert until_closed(sock) == b""  # silently, as uvicorn's keep-alive does


def test_when_full_pre_auth_connections_are_shed_oldest_first_then_idle_ones(
    serve: Serve, sockets: list[socket.socket]
) -> None:
    server = serve(max_connections=3, read_timeout_s=60.0, keep_alive_s=60.0)
    idle = connect(server, sockets, send=GET)
    one_answer(idle)  # answered: kept alive, idle
    wait_until(lambda: phases(server) == [Phase.IDLE], DEADLINE_S, "idle")
    first = connect(server, sockets)
    second = connect(server, sockets, send=b"GET /v1/no")

    newer = connect(server, sockets, grows=False)  # full: the oldest pre-auth one goes
    assert error_of(until_closed(first)) == (503, "too_many_connections")
    answered(newer)  # admitted, and now idle too
    newest = connect(server, sockets, grows=False)  # then the other pre-auth one
    assert error_of(until_closed(second)) == (503, "too_many_connections")
    answered(newest)
    last = connect(server, sockets, grows=False)  # none pre-auth: the oldest idle one goes
    assert until_closed(idle) == b""  # silently
    answered(last)
    wait_until(lambda: phases(server) == [Phase.IDLE] * 3, DEADLINE_S, "three idle")


def answered(sock: socket.socket) -> None:
    """A request on ``sock`` is answered (by the app: node_starting)."""
    sock.sendall(GET)
    status, body = one_answer(sock)
    assert (status, body["error"]["code"]) == (503, "node_starting")  # type: ignore[index]


def test_when_every_connection_has_a_request_in_flight_a_new_one_is_refused(
    serve: Serve, sockets: list[socket.socket]
) -> None:
    server = serve(max_connections=2, read_timeout_s=60.0)
    busy = [connect(server, sockets, send=HALF_POST) for _ in range(2)]
    wait_until(lambda: phases(server) == [Phase.BODY] * 2, DEADLINE_S, "two bodies awaited")
    refused = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sockets.append(refused)
    refused.settimeout(DEADLINE_S)
    refused.connect(str(socket_path(server.ctx.data_dir)))
    assert error_of(until_closed(refused)) == (503, "too_many_connections")
    assert phases(server) == [Phase.BODY] * 2  # the requests in flight are untouched
    for sock in busy:
        sock.close()


def phases(server: ApiServer) -> list[Phase]:
    """The phases of the socket listener's connections, oldest first."""
    return server.listeners.phases("unix")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("max_connections = 0", "[api], key `max_connections`: expected `int` >= 1"),
        ("read_timeout_s = 0", "[api], key `read_timeout_s`: expected `float` > 0.0"),
        ("keep_alive_s = -1.0", "[api], key `keep_alive_s`: expected `float` > 0.0"),
        ("max_conections = 9", "unknown key `max_conections` in [api]; did you mean"),
    ],
)
def test_a_bad_limit_in_the_config_is_refused_naming_the_key(
    tmp_path: Path, line: str, expected: str
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nnode_id = "n1"\ndata_dir = "data"\n\n[api]\n{line}\n')
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert expected in str(refused.value)
