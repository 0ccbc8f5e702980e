"""One front connection: uvicorn's httptools protocol with a deadline for a request
to arrive, as the control API's listeners have (tools/api/connection.py,
docs/api.md "Connection limits").

uvicorn's ``timeout_keep_alive`` runs only between requests: a connection that
sends nothing, or part of a request head or body, was held forever, and about
1,024 of them (``max_connections``) from any local process, token or not, kept
every real client out with 503 ``too_many_connections`` (a newcomer's trial).
Here a request's head must arrive within :data:`ARRIVAL_S` of the connection
opening or of its first byte, and then its body within :data:`ARRIVAL_S` (the
control API's ``read_timeout_s``, per phase, not per read); else it is answered
408 and closed (or just closed, where an answer has begun).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ARRIVAL_S", "FrontConnection"]

#: Seconds a request's head, and then its body, may take to arrive, as the control
#: API's ``read_timeout_s`` (tools/api/limits.py).
ARRIVAL_S = 10.0

_TIMED_OUT_BODY = (
    b'{"error": {"message": "the request did not arrive whole in time", '
    b'"type": "invalid_request_error", "param": null, "code": "timeout"}}'
)
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY)
)


class FrontConnection(HttpToolsProtocol):
    """An httptools connection whose request head, then body, must each arrive
    within :data:`ARRIVAL_S`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arrival: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm()  # the body has a deadline of its own, as on the control API

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
        cycle = getattr(self, "cycle", None)
        if cycle is None or not cycle.response_started:
            self.transport.write(_TIMED_OUT)
        self.transport.close()
