"""adapters.ports: taken ports, free ports, listeners beyond loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from infervisor.adapters.errors import SpecError
from infervisor.adapters.ports import free_port, listeners_beyond_loopback, port_in_use


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def test_listening_socket_is_in_use(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    assert port_in_use("127.0.0.1", port)
    assert port_in_use("localhost", port)


def test_free_port_is_not_in_use() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert not port_in_use("127.0.0.1", port)


def test_bound_but_not_listening_is_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))  # connect is refused, but the bind fails
        assert port_in_use("127.0.0.1", s.getsockname()[1])


def test_wildcard_listener_takes_loopback_port_and_is_beyond_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        assert listeners_beyond_loopback(port) == ["0.0.0.0"]


def test_loopback_listener_is_not_beyond_loopback(listener: socket.socket) -> None:
    assert listeners_beyond_loopback(listener.getsockname()[1]) == []


def test_unresolvable_host_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="does not resolve"):
        port_in_use("no-such-host.invalid", 80)
