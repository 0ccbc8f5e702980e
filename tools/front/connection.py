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

A request's framing is held to the control API's rules
(:mod:`infervisor.tools.netkit.framing`): ``Transfer-Encoding`` with
``Content-Length``, a coding other than ``chunked``, a ``Content-Length`` given
twice, or a body beyond :data:`~.app.MAX_BODY_BYTES` (announced, or as it arrives)
is answered 400 ``bad_framing`` or 413 ``body_too_large`` in OpenAI's shape before
the app sees it, and the connection closed. llhttp refused most of these already,
but uvicorn answered them in plain text ("Invalid HTTP request received."); a body
announced beyond the limit waited for the deadline.
"""

from __future__ import annotations

import asyncio
import http
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..api.limits import Listeners, Phase
from ..netkit.framing import Refusal, body_too_large, framing_refusal, parser_refusal
from . import app
from .errors import FrontError, retry_after

__all__ = ["ARRIVAL_S", "LISTENER", "FrontConnection", "protocol_for"]

#: Seconds a request's head, and then its body, may take to arrive, as the control
#: API's ``read_timeout_s`` (tools/api/limits.py).
ARRIVAL_S = 10.0
#: The front's one listener, as :class:`Listeners` names it.
LISTENER = "front"


class _Refused(Exception):
    """Raised in a parser callback to stop reading a refused request (httptools
    raises it on from ``feed_data`` as an ``HttpParserCallbackError``)."""


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
        self._refusal: Refusal | None = None  # why the request arriving is refused
        self._received = 0  # body bytes of the request arriving

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

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a request refused (by llhttp, or here for its framing or
        size) is answered naming why, in OpenAI's shape, and the connection closed."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # the front serves no WebSocket
        except httptools.HttpParserError as e:
            refusal = self._refusal
            if refusal is None:  # llhttp's: the head's fields say it best when whole
                version = self.parser.get_http_version() or "1.1"
                said = framing_refusal(self.headers or [], version, app.MAX_BODY_BYTES)
                refusal = said or parser_refusal(str(e))
            self._refuse(refusal)

    def on_headers_complete(self) -> None:
        version = self.parser.get_http_version()
        self._refusal = framing_refusal(self.headers, version, app.MAX_BODY_BYTES)
        if self._refusal is not None:
            raise _Refused  # before uvicorn's callback: no app runs for it
        self._received = 0
        super().on_headers_complete()
        self._reading = Phase.BODY
        self._arm()  # the body has a deadline of its own, as on the control API

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        if self._received > app.MAX_BODY_BYTES:  # chunked: the length was not announced
            self._refusal = body_too_large(app.MAX_BODY_BYTES)
            raise _Refused
        super().on_body(body)

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

    def _refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` (unless an answer has begun) and close."""
        if self._may_answer():
            error = FrontError(refusal.status, refusal.message, refusal.code, param=refusal.field)
            self._close_with(_raw(error))
        else:
            self.transport.close()

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
        self._refuse(
            Refusal(
                408,
                "request_timeout",
                f"the request did not arrive whole within {ARRIVAL_S:g} s (its head, then "
                "its body): send the whole request at once",
            )
        )


def protocol_for(listeners: Listeners) -> type[FrontConnection]:
    """The protocol class uvicorn instantiates per connection, bound to ``listeners``."""

    class Bound(FrontConnection):
        pass

    Bound.listeners = listeners
    return Bound
