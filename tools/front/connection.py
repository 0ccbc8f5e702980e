"""One front connection: uvicorn's httptools protocol under the front's connection
limit and with a deadline for a request to arrive, as the control API's listeners
have (tools/api/connection.py, tools/api/limits.py; docs/api.md "Connection
limits").

uvicorn's ``timeout_keep_alive`` runs only between requests: a connection that
sends nothing, or part of a request head or body, was held forever, and about
1,024 of them (``max_connections``) from any local process, token or not, kept
every real client out with 503 ``too_many_connections`` (a newcomer's trial).
Here a request's head must arrive within :data:`ARRIVAL_S` of the connection
opening or of its first byte, and then its body within :data:`ARRIVAL_S` (the
control API's ``read_timeout_s``, per phase, not per read); else it is answered
408 and closed (or just closed, where an answer has begun).

The deadline alone still let a sender that re-opens its half-sent requests hold
the places for the 10 s each lasts. So the connections are counted in the control
API's :class:`~infervisor.tools.api.limits.Listeners` (one implementation of what
is shed): when ``max_connections`` are open, a new connection takes the place of
the oldest one that has not sent a whole request head (answered 503
``too_many_connections``), else of the oldest idle kept-alive one (closed); one
with a request in flight (its body arriving, its answer being made or streamed)
is never shed, and when every connection has one, the new connection is answered
503 ``too_many_connections`` and closed.
"""

from __future__ import annotations

import asyncio
import http
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..api.limits import Listeners, Phase
from .errors import FrontError, retry_after

__all__ = ["ARRIVAL_S", "LISTENER", "FrontConnection", "protocol_for"]

#: Seconds a request's head, and then its body, may take to arrive, as the control
#: API's ``read_timeout_s`` (tools/api/limits.py).
ARRIVAL_S = 10.0
#: The front's one listener, as :class:`Listeners` names it.
LISTENER = "front"

_TIMED_OUT_BODY = (
    b'{"error": {"message": "the request did not arrive whole in time", '
    b'"type": "invalid_request_error", "param": null, "code": "timeout"}}'
)
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY)
)


def _raw(e: FrontError) -> bytes:
    """A whole HTTP/1.1 answer of ``e`` (OpenAI's shape), closing the connection."""
    body = e.body()
    head = f"HTTP/1.1 {e.status} {http.HTTPStatus(e.status).phrase}\r\n"
    head += "content-type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in e.headers.items())
    head += f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


class FrontConnection(HttpToolsProtocol):
    """An httptools connection counted in :attr:`listeners` (set by :func:`protocol_for`),
    whose request head, then body, must each arrive within :data:`ARRIVAL_S`."""

    listeners: Listeners

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arrival: asyncio.TimerHandle | None = None
        self._reading: Phase | None = None  # HEAD or BODY while a request arrives

    # ------------------------------------------------------------ the protocol's events
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.listeners.admit(LISTENER, self):
            self._close_with(self._full("each with a request in flight: retry shortly"))
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = Phase.HEAD
        self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._reading = Phase.BODY
        self._arm()  # the body has a deadline of its own, as on the control API

    def on_message_complete(self) -> None:
        self._reading = None
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.listeners.leave(LISTENER, self)
        super().connection_lost(exc)

    # ------------------------------------------------------------ limits
    @property
    def phase(self) -> Phase:
        """Where this connection is (:class:`~infervisor.tools.api.limits.Phase`)."""
        if self.transport is None or self.transport.is_closing():
            return Phase.CLOSED
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # uvicorn's cycle is the newest request's (a pipelined one's too)
            return Phase.BODY if self._reading is Phase.BODY else Phase.BUSY
        if self._reading is not None:
            # a new head arriving; or a body still arriving after its request was
            # answered (a 401 before the body was read): nothing is in flight
            return Phase.HEAD
        if self.timeout_keep_alive_task is not None:
            return Phase.IDLE  # armed after an answer, cancelled by the next byte
        return Phase.HEAD  # nothing sent yet

    def shed(self) -> None:
        """Closed for a newer connection: a 503 if a request head is being sent (or
        none yet), else silently."""
        if self._may_answer():
            self._close_with(self._full("and this connection had not sent a whole request"))
        else:
            self.transport.close()

    def _full(self, why: str) -> bytes:
        limit = self.listeners.limits.max_connections
        return _raw(
            FrontError(
                503,
                f"the front has {limit} connections open (front.max_connections), {why}",
                "too_many_connections",
                headers={"Retry-After": retry_after(1)},
            )
        )

    def _may_answer(self) -> bool:
        """Whether an answer written now is the answer to the request arriving
        (none begun for it; a kept-alive connection's previous one is whole)."""
        cycle = self.cycle
        if cycle is None:
            return True
        if self._reading is Phase.HEAD:
            return cycle.response_complete
        return not cycle.response_started

    def _close_with(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    # ------------------------------------------------------------ the arrival deadline
    def _arm(self) -> None:
        self._disarm()
        self._arrival = self.loop.call_later(ARRIVAL_S, self._timed_out)

    def _disarm(self) -> None:
        if self._arrival is not None:
            self._arrival.cancel()
            self._arrival = None

    def _timed_out(self) -> None:
        self._arrival = None
        if self.transport.is_closing():
            return
        if self._may_answer():
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def protocol_for(listeners: Listeners) -> type[FrontConnection]:
    """The protocol class uvicorn instantiates per connection, bound to ``listeners``."""

    class Bound(FrontConnection):
        pass

    Bound.listeners = listeners
    return Bound
