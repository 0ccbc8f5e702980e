"""The probe engine's HTTP/1.1 exchange: one kept-alive connection per server,
a request encoded once per path, the answer parsed by httptools.

httptools (llhttp, the C parser of Node.js, as uvicorn and the front's upstream
client use it) parses the answer in C, through a few callbacks per answer; the
engine's probe was mostly h11's pure-Python state machine and asyncio's
streams before (bench/README.md, "Idle supervision ... stop 31"). A GET has no
body and its head depends only on the path and the server, so its bytes are
built once per path and written whole (one ``send`` a request).

:class:`Connection` is what :mod:`.probe_engine` keeps per server; it lives
on the engine's loop. Its errors are :class:`~.errors.ProbeError`, worded as
:class:`~.probe.ServerClient` words them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from functools import partial
from urllib.parse import urlsplit

import httptools

from .errors import ProbeError
from .probe import _Reply

__all__ = ["Answered", "Connection", "Outcome"]

_CLOSED = "{where}: the server closed the connection without answering"
_GONE = "{where}: not probed any more (the instance went away)"
#: Headers that say where an answer's body ends (without: at the connection's end).
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
#: Characters a probe path may hold (the engine's paths are the probe steps' own).
_PATH_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-._~?=&%")


class _Stale(Exception):
    """The server closed a kept-alive connection before a byte of its answer."""


#: What a request sent by :meth:`Connection.send` came to: the answer, the
#: error, or None when the kept connection turned out closed (try a new one).
Outcome = _Reply | ProbeError | None
#: Told the :data:`Outcome` of a request (on the engine's loop).
Answered = Callable[[Outcome], None]


class _Wire(asyncio.Protocol):
    """One TCP connection; the parser's callbacks fill in the answer of the
    request in flight, and call :attr:`then` once when it is whole (or lost)."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.then: Callable[[], None] | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.body = bytearray()
        self.heard = self.head_done = self.complete = self.truncated = False
        self.keep_alive = True
        self.framed = False  # the answer says its length (Content-Length, chunked)
        self.error: BaseException | None = None

    def ask(self, request: bytes, then: Callable[[], None]) -> None:
        """Send ``request``; ``then()`` follows once its answer is whole (or failed)."""
        self.status, self.body = 0, bytearray()
        self.heard = self.head_done = self.complete = self.truncated = self.framed = False
        self.error, self.then = None, then
        assert self.transport is not None
        self.transport.write(request)

    # ---------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # TCP (or TLS over it)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.heard = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._end(ProbeError("an upgrade answer (not HTTP/1.1)"))
        except httptools.HttpParserError as e:
            self._end(ProbeError(f"not an HTTP answer ({e})"))

    def eof_received(self) -> bool | None:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.then is None:
            return
        if self.head_done and not self.framed:
            self._end(None)  # a body without a length ends with the connection
        elif not self.heard:
            self._end(_Stale())
        else:
            self._end(ProbeError("the server closed the connection mid-answer"))

    # ---------------------------------------------------------- parser callbacks
    def on_header(self, name: bytes, _value: bytes) -> None:
        if not self.framed:
            self.framed = name.lower() in _FRAMING

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self.truncated:
            return
        room = self.max_body - len(self.body)
        self.body += body[:room]
        if len(body) > room:  # the rest is never read
            self.truncated = True
            self._end(None)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.head_done = self.framed = False
            return
        self.keep_alive = self.keep_alive and self.parser.should_keep_alive()
        self._end(None)

    def _end(self, error: BaseException | None) -> None:
        then, self.then = self.then, None
        if then is None:
            return
        self.complete = error is None
        self.error = error
        then()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Connection:
    """A kept-alive connection to one server; lives on the engine's loop.

    ``timeout``: seconds for each request; ``max_body``: bytes of a body read.

    Raises:
        ProbeError: ``base_url`` is not ``http(s)://host[:port]``.
    """

    def __init__(self, base_url: str, timeout: float, max_body: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProbeError(f"invalid server URL {base_url!r}: expected http://host:port")
        self.base_url = base_url
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._host_header = parts.netloc
        self.timeout, self._max_body = timeout, max_body
        self._wire: _Wire | None = None
        self._requests: dict[str, bytes] = {}
        self._retired = False
        #: Seconds the last timeout fired after it was due (0: none fired late).
        self.late_s = 0.0

    def send(self, path: str, answered: Answered) -> bool:
        """``GET path`` over the kept connection, without a task: ``answered``
        gets its :data:`Outcome` (within the timeout). False, and nothing sent,
        when no connection is kept (then :meth:`get`, which connects).

        Raises:
            ProbeError: ``path`` is not a probe path.
        """
        wire = self._wire
        if wire is None or wire.lost:
            return False
        request = self._request(path)
        loop = asyncio.get_running_loop()
        due = loop.time() + self.timeout

        def expire() -> None:
            if wire.then is None:
                return  # answered meanwhile
            wire.then = None
            self.close()
            self.late_s = max(self.late_s, loop.time() - due)  # the loop did not run on time
            answered(ProbeError(f"{self.base_url}{path}: no answer within {self.timeout} s"))

        timer = loop.call_at(due, expire)

        def then() -> None:
            timer.cancel()
            answered(self._outcome(wire, path))

        wire.ask(request, then)
        return True

    async def get(self, path: str) -> _Reply:
        """``GET path`` within the timeout; a kept-alive connection the server
        closed meanwhile is replaced once.

        Raises:
            ProbeError: no answer (refused, timed out, reset, not HTTP).
        """
        where = f"{self.base_url}{path}"
        loop = asyncio.get_running_loop()
        due = loop.time() + self.timeout
        reused = self._wire is not None and not self._wire.lost
        try:
            try:
                return await self._exchange(path, where, due)
            except _Stale:
                self.close()
                if not reused:
                    raise ProbeError(_CLOSED.format(where=where)) from None
            try:
                return await self._exchange(path, where, due)
            except _Stale:
                self.close()
                raise ProbeError(_CLOSED.format(where=where)) from None
        except TimeoutError:
            self.close()
            self.late_s = max(self.late_s, loop.time() - due)  # the loop did not run on time
            raise ProbeError(f"{where}: no answer within {self.timeout} s") from None
        except BaseException:
            self.close()  # whatever went wrong, this connection is not used again
            raise

    def retire(self) -> None:
        """Drop the connection for good: a probe still running opens no other."""
        self._retired = True
        self.close()

    def close(self) -> None:
        """Drop the connection (the next GET opens a new one)."""
        wire, self._wire = self._wire, None
        if wire is not None and wire.transport is not None:
            wire.transport.abort()

    # ------------------------------------------------------------------ inside
    async def _exchange(self, path: str, where: str, due: float) -> _Reply:
        loop = asyncio.get_running_loop()
        wire = self._wire
        if wire is None or wire.lost:
            wire = await self._open(where, due)
        waiter: asyncio.Future[None] = loop.create_future()
        timer = loop.call_at(due, _expire, waiter)
        try:
            wire.ask(self._request(path), partial(_wake, waiter))
            await waiter
        finally:
            timer.cancel()
        outcome = self._outcome(wire, path)
        if outcome is None:
            raise _Stale
        if isinstance(outcome, ProbeError):
            raise outcome
        return outcome

    def _outcome(self, wire: _Wire, path: str) -> Outcome:
        """The answer of the request ``wire`` ended (the connection closed when it
        is not to be used again)."""
        if wire.error is not None:
            self.close()
            if isinstance(wire.error, _Stale):
                return None
            return ProbeError(f"{self.base_url}{path}: {wire.error}")
        if wire.truncated or not wire.keep_alive:
            self.close()  # the rest of a long body; or the server closes after this answer
        return _Reply(wire.status, bytes(wire.body), truncated=wire.truncated)

    def _request(self, path: str) -> bytes:
        """The request's bytes, built once a path."""
        request = self._requests.get(path)
        if request is None:
            if not path.startswith("/") or not set(path) <= _PATH_OK:
                raise ProbeError(f"{self.base_url}{path!r}: not a probe path")
            head = f"GET {path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            request = self._requests[path] = (head + "Accept: application/json\r\n\r\n").encode()
        return request

    async def _open(self, where: str, due: float) -> _Wire:
        if self._retired:
            raise ProbeError(_GONE.format(where=where))
        loop = asyncio.get_running_loop()
        context = ssl.create_default_context() if self._tls else None
        max_body = self._max_body
        try:
            async with asyncio.timeout_at(due):
                _, wire = await loop.create_connection(
                    lambda: _Wire(max_body), self._host, self._port, ssl=context
                )
        except TimeoutError:
            # not a refusal: get() says how late the timer fired (a node paused mid-connect)
            raise
        except OSError as e:
            raise ProbeError(f"{where}: cannot connect ({e.strerror or e})") from e
        if self._retired:  # retired while it connected
            if wire.transport is not None:
                wire.transport.abort()
            raise ProbeError(_GONE.format(where=where))
        self._wire = wire
        return wire
