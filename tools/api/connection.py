"""One control-API connection: uvicorn's h11 protocol with the listener and the
socket peer in the ASGI scope, the per-listener cap, the read deadlines, the
request framing and body size (:mod:`infervisor.tools.netkit.framing`) and
``TCP_NODELAY`` (see :mod:`.limits`, docs/api.md "Connection limits").

uvicorn's own ``timeout_keep_alive`` only runs between requests: a connection
that never sends a complete head is held forever (issue 17: 3,000 such
connections all stayed open). The read deadline here covers that.
``TCP_NODELAY`` is set on every TCP connection: asyncio sets it only for
sockets created with ``IPPROTO_TCP`` as their protocol, and without it an
answer written in two parts waits for the client's delayed ACK (about 40 ms
on each request after the first of a kept-alive connection).

What h11 cannot read, and what :func:`~infervisor.tools.netkit.framing.framing_refusal`
refuses of what it can (a trial, stop 35: ``Transfer-Encoding`` with
``Content-Length`` was taken; a body announced beyond :data:`~.idempotency.MAX_BODY`
waited for the read deadline and was then closed unanswered), is answered in the
API's error shape before any app sees the request, and the connection closed;
uvicorn's own answer was a plain-text "Invalid HTTP request received.".
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..netkit.framing import Refusal, body_too_large, framing_refusal, parser_refusal
from .auth import peer_of
from .idempotency import MAX_BODY
from .limits import TIMED, Listeners, Phase, raw_error

__all__ = ["ApiConnection", "protocol_for"]

log = logging.getLogger(__name__)


class _Framed(h11.Connection):
    """h11's server side, which also refuses a request :func:`framing_refusal` refuses
    and a body growing past ``limit`` bytes: :attr:`refusal` says why, and
    :meth:`next_event` raises ``h11.RemoteProtocolError``, which uvicorn answers
    through :meth:`ApiConnection.send_400_response` without running the app."""

    def __init__(self, limit: int, max_incomplete_event_size: int | None) -> None:
        if max_incomplete_event_size is None:  # uvicorn's default: h11's own
            super().__init__(h11.SERVER)
        else:
            super().__init__(h11.SERVER, max_incomplete_event_size)
        self.limit = limit
        self.refusal: Refusal | None = None
        self._received = 0  # body bytes of the request arriving

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            self.refusal = self.refusal or parser_refusal(str(e))
            raise
        if isinstance(event, h11.Request):
            self._received = 0
            version = event.http_version.decode("ascii")
            self.refusal = framing_refusal(event.headers, version, self.limit)
        elif isinstance(event, h11.Data):
            self._received += len(event.data)
            if self._received > self.limit:  # chunked: the length was not announced
                self.refusal = body_too_large(self.limit)
        if self.refusal is not None:
            raise h11.RemoteProtocolError(self.refusal.message)
        return event


class ApiConnection(H11Protocol):
    """An h11 connection under the limits of :attr:`listeners` (set by :func:`protocol_for`)."""

    listeners: Listeners

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _Framed(MAX_BODY, self.config.h11_max_incomplete_event_size)
        self.listener = "tcp"
        self.admitted = False
        self.timeout_keep_alive = self.listeners.limits.keep_alive_s  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None
        self._timed: Phase | None = None  # the phase _deadline was armed for

    # ------------------------------------------------------------ the protocol's events
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        unix = sock is not None and sock.family == socket.AF_UNIX
        self.listener = "unix" if unix else "tcp"
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.listeners.admit(self.listener, self):
            self._refuse()
            return
        self.admitted = True
        peer = peer_of(sock) if unix else None
        self.app = _scoped(self.app, self.listener, peer)
        self._track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.listeners.leave(self.listener, self)
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request h11 or :class:`_Framed` refused (``msg``: uvicorn's words): its
        refusal in the API's error shape, then the close."""
        assert isinstance(self.conn, _Framed)
        refusal = self.conn.refusal or parser_refusal(msg)
        self._close_unanswered(refusal.status, refusal.code, refusal.message, refusal.field)

    # ------------------------------------------------------------ limits
    @property
    def phase(self) -> Phase:
        """Where this connection is (see :class:`~.limits.Phase`)."""
        if self.transport is None or self.transport.is_closing():
            return Phase.CLOSED
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return Phase.BODY
        if state is not h11.IDLE:
            return Phase.BUSY
        if self.timeout_keep_alive_task is not None:
            return Phase.IDLE  # armed after an answer, cancelled by the next byte
        return Phase.HEAD

    def shed(self) -> None:
        """Closed for a newer connection: a 503 if a request is being sent, else silently."""
        if self.phase is Phase.HEAD:
            self._close_with(
                503,
                "too_many_connections",
                f"the {self.listener} listener is full "
                f"({self.listeners.limits.max_connections} connections, api.max_connections) "
                "and this connection had not sent a complete request: retry",
            )
        else:
            self.transport.close()

    def _refuse(self) -> None:
        self._close_with(
            503,
            "too_many_connections",
            f"the {self.listener} listener has {self.listeners.limits.max_connections} "
            "connections (api.max_connections), each with a request in flight: retry shortly",
        )

    def _track(self) -> None:
        """Arm the read deadline when a timed phase begins, disarm it when it ends."""
        phase = self.phase
        if phase is self._timed:
            return  # the deadline runs from the phase's start, not from each read
        self._disarm()
        if phase in TIMED:
            self._timed = phase
            timeout = self.listeners.limits.read_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._timed = None, None

    def _expired(self, phase: Phase) -> None:
        self._deadline, self._timed = None, None
        if self.phase is not phase:
            return
        what = "request head" if phase is Phase.HEAD else "request body"
        timeout = self.listeners.limits.read_timeout_s
        # a body: the app waiting for it sees the client gone and answers nothing, so
        # a verb never runs on part of a body; the caller is told why (a trial, stop 35:
        # it was closed unanswered)
        self._close_unanswered(
            408,
            "request_timeout",
            f"the {what} did not arrive within {timeout:g} s (api.read_timeout_s): "
            "send the whole request at once",
        )

    def _close_unanswered(
        self, status: int, code: str, message: str, field: str | None = None
    ) -> None:
        """Answer the request arriving with this error, unless an answer to it has
        begun (then only close: a second answer would be read as the next one's)."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            self._close_with(status, code, message, field)
        else:
            self.transport.close()

    def _close_with(self, status: int, code: str, message: str, field: str | None = None) -> None:
        if not self.transport.is_closing():
            self.transport.write(raw_error(status, code, message, field))
            self.transport.close()


def _scoped(app: Any, listener: str, peer: object) -> Any:
    """``app`` with the listener and the socket peer in every request's scope."""

    async def scoped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["infervisor.listener"] = listener
        scope["infervisor.peer"] = peer
        await app(scope, receive, send)

    return scoped


def protocol_for(listeners: Listeners) -> type[ApiConnection]:
    """The protocol class uvicorn instantiates per connection, bound to ``listeners``."""

    class Bound(ApiConnection):
        pass

    Bound.listeners = listeners
    return Bound
