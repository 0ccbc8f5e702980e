"""A streamed answer's body passed from the server's socket to the client's as it
arrives, still in its HTTP/1.1 chunked framing (the front's hot path, issue 21).

After a stream's first token the server's socket is read at most once a flush
interval (``[front] stream_flush_interval_s``, 5 ms by default): the pieces the
server sends meanwhile go on in one read and one write, as a reverse proxy's
flush interval does (Go's ``httputil.ReverseProxy.FlushInterval``, Caddy's
``flush_interval``). A model that generates slower than that is passed piece by
piece as before; a fast one costs the node and the client a wake-up per interval
rather than per token.

When the server answers ``Transfer-Encoding: chunked`` and the client's
connection speaks HTTP/1.1 chunked too (uvicorn frames every answer without a
length so), the chunks need no re-framing: each piece the server's socket
gives is written to the client's socket unchanged, from the upstream
connection's ``data_received`` itself. No parser callback, queue, future,
task switch or ASGI message per piece; :class:`Dechunk` only follows the
framing to find where the body ends (the last chunk, size 0, is not passed:
the ASGI server writes its own when the app ends the answer), and
:class:`PipeCounter` counts tokens with a few ``bytes.count`` per piece.

The client's socket is reached through the ASGI server's ``send``: uvicorn's
``RequestResponseCycle`` carries its ``transport`` and ``flow`` (write
pausing); :func:`client_socket` returns None for any other server, and the
front then passes the answer through ASGI messages as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .upstream_errors import UpstreamError
from .usage import StreamCounter, Usage

__all__ = [
    "AnswerCutOff",
    "ClientSocket",
    "Dechunk",
    "FramingError",
    "PipeCounter",
    "Piped",
    "client_socket",
    "cut_off",
]

#: Bytes a chunk's size line may take (with extensions) before the framing is refused.
SIZE_LINE_MAX = 4096


class FramingError(Exception):
    """The server's chunked framing is broken (a size that is not hex, a size line
    that never ends)."""


class Dechunk:
    """Follows HTTP/1.1 chunked framing (RFC 9112 7.1) over pieces split anywhere.

    :meth:`feed` answers the part of a piece to pass on: all of it, less the last
    chunk (``0``, trailers, the final CRLF) and less a size line not whole yet
    (held, and given back at the start of the next piece's part).
    """

    __slots__ = ("_held", "_left", "ended", "tail")

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data and its CRLF still to come
        self._held = b""
        self.ended = False
        #: What followed the last chunk's start (``0\\r\\n\\r\\n`` when there are no trailers).
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` (the next bytes of the body) to pass on.

        Raises:
            FramingError: a size line that is not hex or is over :data:`SIZE_LINE_MAX`.
        """
        if self._held:
            data, self._held = self._held + data, b""
        at, end = 0, len(data)
        while at < end:
            if self._left:
                step = min(self._left, end - at)
                at += step
                self._left -= step
                continue
            eol = data.find(b"\n", at)
            if eol < 0:
                if end - at > SIZE_LINE_MAX:
                    raise FramingError(f"a chunk size line over {SIZE_LINE_MAX} bytes")
                self._held = data[at:]
                return data[:at]
            size = _size(data[at:eol])
            if size == 0:
                self.ended = True
                self.tail = data[at:]
                return data[:at]
            self._left = size + 2  # the data, then CRLF
            at = eol + 1
        return data


def _size(line: bytes) -> int:
    try:
        size = int(line.split(b";", 1)[0], 16)  # int() takes the CR as whitespace
    except ValueError:
        raise FramingError(f"a chunk size that is not hex: {line[:40]!r}") from None
    if size < 0:
        raise FramingError(f"a negative chunk size: {line[:40]!r}")
    return size


#: Where a stream's piece carries text (as :mod:`.usage` reads it line by line):
#: OpenAI's chat delta and completion, Ollama's ``/api/generate`` and ``/api/chat``.
_TEXT = (b'"content":"', b'"text":"', b'"response":"')
_EMPTY = (b'"content":""', b'"text":""', b'"response":""')
_USAGE = (b'"usage"', b'"eval_count"')


class PipeCounter:
    """Tokens of a stream passed through unparsed, counted by bytes: the usage the
    server reports (a piece that names ``usage`` or ``eval_count`` is read line by
    line), else one completion token per ``"content":"``, ``"text":"`` or
    ``"response":"`` followed by text. A key split between two pieces is missed
    (the count is then one short; a reported usage is exact)."""

    __slots__ = ("texts", "usage")

    def __init__(self) -> None:
        self.texts = 0
        self.usage: Usage | None = None

    def feed(self, piece: bytes) -> None:
        c = piece.count
        self.texts += c(_TEXT[0]) + c(_TEXT[1]) + c(_TEXT[2])
        self.texts -= c(_EMPTY[0]) + c(_EMPTY[1]) + c(_EMPTY[2])
        if _USAGE[0] in piece or _USAGE[1] in piece:
            lines = StreamCounter()
            lines.feed(piece)
            found = lines.close()
            if lines.usage is not None:
                self.usage = found

    def close(self) -> Usage:
        return self.usage or Usage(0, self.texts)


class ClientSocket(Protocol):
    """The client's connection as the pipe writes to it."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    @property
    def write_paused(self) -> bool: ...

    def drain(self) -> Awaitable[None]: ...


class _Uvicorn:
    """uvicorn's cycle (``send.__self__``): its transport (asyncio's or uvloop's) and
    its flow control."""

    __slots__ = ("_flow", "_transport", "write")

    def __init__(self, transport: Any, flow: Any) -> None:
        self._transport = transport
        self._flow = flow
        self.write: Callable[[bytes], None] = transport.write

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    @property
    def write_paused(self) -> bool:
        return bool(self._flow.write_paused)

    def drain(self) -> Awaitable[None]:
        drained: Awaitable[None] = self._flow.drain()
        return drained


def client_socket(send: Callable[..., Any], scope: dict[str, Any]) -> ClientSocket | None:
    """The client's socket behind ``send``, once the answer's head was sent with
    chunked framing on HTTP/1.1 (uvicorn's ``chunked_encoding``); None otherwise."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    flow = getattr(cycle, "flow", None)
    if (
        scope.get("http_version") != "1.1"
        or getattr(cycle, "chunked_encoding", None) is not True
        or not all(hasattr(transport, m) for m in ("write", "is_closing"))
        or not hasattr(flow, "write_paused")
        or not hasattr(flow, "drain")
    ):
        return None
    return _Uvicorn(transport, flow)


class AnswerCutOff(Exception):
    """An answer the server did not finish, under an ASGI server other than uvicorn:
    raised so that server closes the connection without the answer's end."""


def cut_off(send: Callable[..., Any]) -> None:
    """Close the client's connection without ending its answer: no last chunk (or
    short of its Content-Length), so the client's HTTP library reports the answer
    cut (``openai``: ``APIConnectionError``), as it would straight from a server
    that died mid-answer. The bytes already written still go out first.

    uvicorn's cycle is marked disconnected first: its ``send`` then writes nothing
    more, and it does not log the answer as left incomplete by the app.

    Raises:
        AnswerCutOff: ``send`` is not uvicorn's (the ASGI server closes the
            connection on an exception after the answer began).
    """
    cycle: Any = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if cycle is None or transport is None or not hasattr(cycle, "disconnected"):
        raise AnswerCutOff("the server ended its answer early")
    cycle.disconnected = True
    transport.close()


class Wire(Protocol):
    """The upstream connection (:class:`~.upstream._Conn`) as a pipe drives it."""

    complete: bool
    paused: bool
    keep_alive: bool
    lost: bool
    error: UpstreamError | None
    transport: asyncio.Transport | None

    def fail(self, error: UpstreamError) -> None: ...

    def close(self) -> None: ...

    def wake(self) -> None: ...

    def ended(self) -> None: ...

    async def wait(self, timeout_s: float, since: Callable[[], float] | None = None) -> None: ...


class Piped:
    """A chunked body going from the server's socket to the client's: the
    connection's ``data_received`` calls :meth:`received` with each piece;
    :meth:`run` waits for the end and drains the client's socket when it fills."""

    __slots__ = ("counter", "flush_s", "framing", "held_back", "loop", "seen", "sink", "wire")

    def __init__(
        self,
        wire: Wire,
        sink: ClientSocket,
        loop: asyncio.AbstractEventLoop,
        flush_interval_s: float = 0.0,
    ) -> None:
        self.wire = wire
        self.sink = sink
        self.loop = loop
        self.framing = Dechunk()
        self.counter = PipeCounter()
        #: The loop time the last piece came (or the client's socket drained).
        self.seen = loop.time()
        #: After the first token, the server's socket is read at most once this often
        #: (seconds; 0: every piece at once): ``[front] stream_flush_interval_s``.
        self.flush_s = flush_interval_s
        #: The timer that reads the server's socket again (reading is held back till then).
        self.held_back: asyncio.TimerHandle | None = None

    async def run(self, held: bytes | None, timeout_s: float) -> PipeCounter:
        """Pass ``held`` (the body's bytes read before), then the rest as it comes,
        until the last chunk; reading pauses while the client's socket is full.

        Raises:
            UpstreamError: the server closed the connection midway, broke the framing
                or sent nothing for ``timeout_s`` (``UpstreamTimeout``).
        """
        try:
            return await self._run(held, timeout_s)
        finally:
            if self.held_back is not None:  # the connection may serve another request next
                self.held_back.cancel()
                self.held_back = None

    async def _run(self, held: bytes | None, timeout_s: float) -> PipeCounter:
        wire = self.wire
        if held:
            self.received(held)
        if wire.lost:
            wire.ended()
        while not wire.complete:
            if wire.error is not None:
                raise wire.error
            if wire.paused:
                await self.sink.drain()
                self.seen = self.loop.time()
                wire.paused = False
                if self.held_back is None and wire.transport is not None and not wire.lost:
                    wire.transport.resume_reading()
                continue
            await wire.wait(timeout_s, self._since)
        return self.counter

    def _since(self) -> float:
        return self.seen

    def received(self, data: bytes) -> None:
        """The next bytes of the body, from the server's socket."""
        wire = self.wire
        if self.framing.ended:
            return  # the last chunk's trailers, or its CRLF
        self.seen = self.loop.time()
        if self.sink.is_closing():
            self._stop(UpstreamError("the client went away"))
            return
        try:
            out = self.framing.feed(data)
        except FramingError as e:
            self._stop(UpstreamError(f"the server's chunked framing is broken: {e}"))
            return
        if out:
            self.sink.write(out)
            self.counter.feed(out)
        if self.framing.ended:
            wire.complete = True
            wire.keep_alive = wire.keep_alive and self.framing.tail == b"0\r\n\r\n"
            wire.wake()
        elif not wire.paused and self.sink.write_paused and wire.transport is not None:
            wire.paused = True
            wire.transport.pause_reading()
            wire.wake()
        elif self.flush_s and self.counter.texts and wire.transport is not None:
            # The next pieces gather in the socket meanwhile: one read and one write pass
            # them all, not one per token (the client wakes once for them too). The first
            # token is never held: it went out above.
            wire.transport.pause_reading()
            self.held_back = self.loop.call_later(self.flush_s, self._read_again)

    def _read_again(self) -> None:
        """The flush interval is over: read what gathered (unless the client's socket
        is full: :meth:`run` reads again once it drains)."""
        self.held_back = None
        wire = self.wire
        if not wire.paused and wire.transport is not None and not wire.lost:
            wire.transport.resume_reading()

    def lost(self, exc: Exception | None) -> None:
        """The server closed the connection."""
        if not self.framing.ended:
            self.wire.fail(UpstreamError(f"the server closed the connection mid-answer ({exc})"))

    def _stop(self, error: UpstreamError) -> None:
        self.wire.fail(error)
        self.wire.close()
        self.wire.wake()
