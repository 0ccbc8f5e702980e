"""The control API's connection limits: a cap per listener, what is shed when
it is full, and the read deadlines (issue 17).

Each listener (the Unix socket, TCP) has a cap of its own, so abuse of the
TCP port cannot lock the local operator out of the socket. A connection is in
one :class:`Phase` at a time; when a listener is full, a new connection
takes the place of the oldest connection that has no request in flight,
pre-auth ones (no complete request head yet) first, then idle kept-alive
ones (:data:`SHED_ORDER`). When every connection has a request in flight (a
watch stream, a verb), the new one is refused: it gets a 503 and is closed.

The same shape as nginx's ``client_header_timeout`` / ``client_body_timeout``
and ``keepalive_timeout``: the request head must arrive within
``read_timeout_s`` of the connection opening (or of a kept-alive
connection's next byte), the body within ``read_timeout_s`` of the head;
a request in flight (its answer being computed or streamed) has no deadline
here.
"""

from __future__ import annotations

import enum
import http
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import msgspec

from .wire import ErrorBody, ErrorEnvelope

__all__ = [
    "ACCEPT_BATCH",
    "LISTEN_BACKLOG",
    "SHED_ORDER",
    "ConnectionLimits",
    "Listeners",
    "Phase",
    "Shed",
    "raw_error",
]


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of every listener (``[api]`` keys of the same names).

    Attributes:
        max_connections: open connections per listener (Unix socket and TCP each).
        read_timeout_s: seconds for a request head, and then for its body.
        keep_alive_s: seconds a connection may stay idle between requests.
    """

    max_connections: int = 256
    read_timeout_s: float = 10.0
    keep_alive_s: float = 30.0


class Phase(enum.Enum):
    """Where a connection is in its request/response cycle."""

    HEAD = "head"  # waiting for (the rest of) a request head: pre-auth
    BODY = "body"  # the head is in, (the rest of) its body is awaited
    BUSY = "busy"  # a request is in flight: its answer is being made or streamed
    IDLE = "idle"  # kept alive between requests, nothing received since the last answer
    CLOSED = "closed"


#: The listen backlog, which is also how many connections asyncio accepts at once
#: before any of them is looked at (``BaseSelectorEventLoop._accept_connection``):
#: uvicorn's default of 2048 let a flood take the node to ~800 descriptors above
#: its caps before the first was shed.
ACCEPT_BATCH = 64
#: The kernel's queue of connections not accepted yet, set once serving began
#: (a second ``listen()`` changes only the queue): they cost the node no
#: descriptor, and a client whose handshake waits in a full queue's dropped
#: SYN loses a second or more per retry.
LISTEN_BACKLOG = 1024

#: Phases that may be shed for a new connection, the cheapest first.
SHED_ORDER = (Phase.HEAD, Phase.IDLE)
#: Phases under a read deadline (``read_timeout_s``).
TIMED = frozenset({Phase.HEAD, Phase.BODY})


class Shed(Protocol):
    """What :class:`Listeners` needs of a connection."""

    @property
    def phase(self) -> Phase: ...

    def shed(self) -> None:
        """Close the connection to make room for a newer one."""


class Listeners:
    """The open connections of each listener, oldest first (event loop thread only)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._open: dict[str, dict[Shed, None]] = {}

    def admit(self, listener: str, conn: Shed) -> bool:
        """Count ``conn`` on ``listener``; False (not counted) when it is full and
        nothing can be shed. A shed connection is forgotten here at once."""
        open_ = self._open.setdefault(listener, {})
        if len(open_) >= self.limits.max_connections:
            victim = next(self._sheddable(open_), None)
            if victim is None:
                return False
            del open_[victim]
            victim.shed()
        open_[conn] = None
        return True

    def leave(self, listener: str, conn: Shed) -> None:
        """``conn`` is closed (idempotent)."""
        self._open.get(listener, {}).pop(conn, None)

    def count(self, listener: str) -> int:
        """Connections counted on ``listener`` now."""
        return len(self._open.get(listener, {}))

    def phases(self, listener: str) -> list[Phase]:
        """The phases of ``listener``'s connections, oldest first (a snapshot, any thread)."""
        return [c.phase for c in list(self._open.get(listener, {}))]

    @staticmethod
    def _sheddable(open_: dict[Shed, None]) -> Iterator[Shed]:
        for phase in SHED_ORDER:
            yield from (c for c in open_ if c.phase is phase)


def raw_error(status: int, code: str, message: str, field: str | None = None) -> bytes:
    """A whole HTTP/1.1 answer with the API's error envelope and ``Connection: close``,
    for a connection that has no request to answer through the framework."""
    error = ErrorBody(code=code, message=message, field=field)
    body = msgspec.json.encode(ErrorEnvelope(error=error))
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
