"""How a request's body is framed, refused alike by the node's HTTP/1.1 listeners
(tools/netkit/framing.py): the control API (h11) on its Unix socket and on TCP,
and the front (httptools).

A trial (stop 35) found the control API took ``Transfer-Encoding`` together with
``Content-Length`` (RFC 9112 section 6.1: the request-smuggling vector), answered
what its parser refused in plain text, and let a body announced beyond its limit
wait for the read deadline, then closed it unanswered. Here each refusal is an
error in the listener's own shape, given before any app (or authentication) runs,
and then the connection is closed.

Neither server has a node open: a request framed well is answered by the app
(503 ``node_starting``, or 401 on TCP without a token), never ``bad_framing``.
Raw sockets, since an HTTP client would not send these requests.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_api_limits import DEADLINE_S, until_closed

from infervisor.adapters.ports import free_port
from infervisor.tools.api import connection as api_connection
from infervisor.tools.api.auth import TcpAddress, Tokens
from infervisor.tools.api.scopes import Scope
from infervisor.tools.api.serving.server import ApiServer, socket_path
from infervisor.tools.front import FrontConfig, FrontServer
from infervisor.tools.front import app as front_app

LIMIT = 1000  # bytes: each listener's body limit here (1 MiB and 64 MiB in a node)
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@dataclass
class Listener:
    name: str
    connect: Callable[[], socket.socket]


@pytest.fixture(params=["api-unix", "api-tcp", "front"])
def listener(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Listener]:
    monkeypatch.setattr(api_connection, "MAX_BODY", LIMIT)
    monkeypatch.setattr(front_app, "MAX_BODY_BYTES", LIMIT)
    port = free_port()
    address = TcpAddress("127.0.0.1", port)
    tokens = Tokens({"ci": "secret"}, {"ci": Scope.READ})
    if request.param == "front":
        front = FrontServer.listen(FrontConfig(listen=f"127.0.0.1:{port}"), address, tokens, "n1")
        try:
            yield Listener("front", lambda: socket.create_connection(("127.0.0.1", port)))
        finally:
            front.close()
        return
    data = tmp_path / "data"
    data.mkdir()
    api = ApiServer.listen(data, data / "chain.db", "n1", tcp=address, tokens=tokens)

    def unix() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(socket_path(data)))
        return sock

    try:
        if request.param == "api-unix":
            yield Listener("api-unix", unix)
        else:
            yield Listener("api-tcp", lambda: socket.create_connection(("127.0.0.1", port)))
    finally:
        api.close()


def exchange(listener: Listener, sent: bytes) -> bytes:
    """Everything ``listener`` answers to ``sent`` until it closes the connection
    (fails if it keeps it open)."""
    with listener.connect() as sock:
        sock.settimeout(DEADLINE_S)
        sock.sendall(sent)
        return until_closed(sock)


def refusal(answer: bytes) -> tuple[int, str, str | None, str]:
    """(status, code, field, message) of one error answer ending in the close, in
    either shape (the API's ``field``, OpenAI's ``param``)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"\r\nconnection: close\r\n" in head.lower() + b"\r\n", head
    assert b"content-type: application/json" in head.lower(), head
    error = json.loads(body)["error"]
    field = error["field"] if "field" in error else error["param"]
    return int(head.split(b" ", 2)[1]), error["code"], field, error["message"]


TE = "Transfer-Encoding"
CL = "Content-Length"
REFUSED = [
    (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", TE, "smuggling"),
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", TE, "smuggling"),
    (b"Transfer-Encoding: gzip\r\n\r\n", TE, "chunked"),
    (b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", TE, "chunked"),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", TE, "chunked"),
    (b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", CL, "once"),
    (b"Content-Length: 2, 3\r\n\r\n{}x", CL, "once"),
    (b"Content-Length: +2\r\n\r\n{}", CL, "decimal"),
]


@pytest.mark.parametrize(("framing", "field", "said"), REFUSED)
def test_a_body_framed_two_ways_or_unknown_ways_is_400_and_closed(
    listener: Listener, framing: bytes, field: str, said: str
) -> None:
    status, code, named, message = refusal(exchange(listener, HEAD + framing))
    assert (status, code, named) == (400, "bad_framing", field), message
    assert said in message and "RFC 9112 section 6" in message, message


def test_transfer_encoding_in_an_http_1_0_request_is_400(listener: Listener) -> None:
    sent = HEAD.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    status, code, named, message = refusal(exchange(listener, sent))
    assert (status, code, named) == (400, "bad_framing", TE), message
    assert "HTTP/1.0" in message


def test_a_body_announced_beyond_the_limit_is_413_at_once(listener: Listener) -> None:
    # nothing of the body is sent: the answer cannot wait for it (it waited for the
    # read deadline, then the connection closed unanswered)
    sent = HEAD + f"Content-Length: {LIMIT + 1}\r\n\r\n".encode()
    status, code, named, message = refusal(exchange(listener, sent))
    assert (status, code, named) == (413, "body_too_large", "body"), message
    assert f"{LIMIT + 1} bytes" in message and f"at most {LIMIT} bytes" in message


def test_a_chunked_body_beyond_the_limit_is_413(listener: Listener) -> None:
    # one chunk one byte over the limit, not even finished: refused as it arrives
    sent = (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % (LIMIT + 1) + b"x" * (LIMIT + 1)
    )
    status, code, named, message = refusal(exchange(listener, sent))
    assert (status, code, named) == (413, "body_too_large", "body"), message
    assert f"at most {LIMIT} bytes" in message


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 2\r\n\r\n{}",
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"Transfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"Content-Length: " + str(LIMIT).encode() + b"\r\n\r\n" + b" " * LIMIT,
    ],
)
def test_a_body_framed_one_way_within_the_limit_reaches_the_app(
    listener: Listener, framing: bytes
) -> None:
    with listener.connect() as sock:
        sock.settimeout(DEADLINE_S)
        sock.sendall(HEAD + framing)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {got!r}"
            got += chunk
    status = int(got.split(b" ", 2)[1])
    assert status in (400, 401, 404, 503), got  # the app's answer (no node, no token)
    assert b"bad_framing" not in got and b"body_too_large" not in got, got


def test_an_identical_content_length_twice_is_taken_by_the_api_and_refused_by_the_front(
    listener: Listener,
) -> None:
    """RFC 9110 section 8.6 lets a recipient take identical copies as one: h11 does
    (one length: nothing to smuggle); llhttp refuses them. docs/api.md says both."""
    sent = HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}"
    if listener.name == "front":
        status, code, named, _ = refusal(exchange(listener, sent))
        assert (status, code, named) == (400, "bad_framing", CL)
        return
    with listener.connect() as sock:
        sock.settimeout(DEADLINE_S)
        sock.sendall(sent)
        assert b"bad_framing" not in sock.recv(65536)


@pytest.mark.parametrize(
    "sent", [b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", b"x" * 60_000 + b"\r\n\r\n"]
)
def test_what_the_parser_cannot_read_is_answered_in_the_listeners_shape(
    listener: Listener, sent: bytes
) -> None:
    status, code, named, message = refusal(exchange(listener, sent))
    assert (status, code, named) == (400, "bad_request", None), message
    assert message.startswith("the request is not valid HTTP/1.1: "), message
    assert len(message) < 400, message  # h11 quotes the line it could not read: cut
