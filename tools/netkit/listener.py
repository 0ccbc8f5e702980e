"""Setting up an HTTP listener of the node's tools: the TCP socket, and the
uvicorn settings every one of them shares.

Used by the control API (tools/api/serving/server.py), the OpenAI-compatible front
(tools/front/server.py) and the witness (tools/witness/server.py); each turns
:class:`ListenError` into its own error (the API's ``ApiError``, the witness's
``ConfigError``).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

import uvicorn

__all__ = ["ListenError", "bind_tcp", "uvicorn_config"]


class ListenError(Exception):
    """The address cannot be listened on: the message names the config key (when
    given), the address and the system's reason.

    Attributes:
        key: the config key given to :func:`bind_tcp` (``""``: none).
        taken: the port is in use (``EADDRINUSE``).
        code: ``port_taken`` when it is, else ``bad_config`` (the API's codes).
        status: 409 when it is, else 400.
    """

    def __init__(self, key: str, host: str, port: int, cause: OSError) -> None:
        where = f"{key} {host}:{port}" if key else f"{host}:{port}"
        super().__init__(f"cannot listen on {where}: {cause.strerror or cause}")
        self.key = key
        self.taken = cause.errno == errno.EADDRINUSE
        self.code = "port_taken" if self.taken else "bad_config"
        self.status = 409 if self.taken else 400


def bind_tcp(host: str, port: int, backlog: int, *, key: str = "") -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (``SO_REUSEADDR``).

    Created with protocol ``IPPROTO_TCP``, so that asyncio sets ``TCP_NODELAY``
    on each connection it accepts (it does only for sockets of that protocol:
    without it an answer written in two parts waits for the client's delayed
    ACK, about 40 ms).

    Args:
        host: an IPv4 or IPv6 address (IPv6 when it has a ``:``).
        port: 1-65535 (0: any free port).
        backlog: connections the kernel queues before they are accepted.
        key: the config key that named the address, for the error's message.

    Raises:
        ListenError: the socket cannot be bound or listened on (closed first).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise ListenError(key, host, port, e) from e
    sock.setblocking(False)
    return sock


def uvicorn_config(app: Any, **settings: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` with what every listener of the node sets:
    no WebSocket (an upgrade is answered as plain HTTP), no logging config or
    access log of uvicorn's own (the node's logging is), no ``Server`` header,
    and proxy headers not trusted (the peer is the socket's). ``settings`` add
    to these (``http``, ``lifespan``, the timeouts) or replace them."""
    shared: dict[str, Any] = {
        "ws": "none",
        "log_config": None,
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
    }
    return uvicorn.Config(app, **{**shared, **settings})
