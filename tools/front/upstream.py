"""The servers behind the front: a small HTTP/1.1 client on asyncio, one pool of
kept-alive connections per server address, kept for the front's life.

Why not httpx or httpcore: the front's requests go only to loopback servers
the node launched or adopted, over plain HTTP/1.1, and the answer's bytes are
passed on unchanged; what it needs is one write per request and a parser.
httpx and then httpcore (h11, anyio) cost most of the front's time per
request in a py-spy profile (the commit messages give the figures): their
connect ran a task group, each request was two writes (head, then body), and
h11 parses in Python. Here a request is one ``transport.write``, and the
answer is parsed by httptools (llhttp, C), which uvicorn already serves the
front with. A connection is an :class:`asyncio.Protocol`: the answer's pieces
are queued as they arrive and reading pauses while the queue is long
(backpressure: the server's socket fills, and it waits).

Exceptions: :mod:`.upstream_errors` (re-exported here). A chunked stream can
also be piped to the client's socket unparsed (:mod:`.pipe`, :meth:`Answer.pipe`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import msgspec

from .pipe import ClientSocket, PipeCounter, Piped
from .upstream_errors import UpstreamDropped, UpstreamError, UpstreamRefused, UpstreamTimeout

__all__ = [
    "Answer",
    "UpstreamDropped",
    "UpstreamError",
    "UpstreamRefused",
    "UpstreamTimeout",
    "Upstreams",
]

#: Seconds to open a connection to a server on this machine.
CONNECT_TIMEOUT_S = 5.0
#: Seconds an idle kept-alive connection is kept (llama-server's cpp-httplib
#: closes one after 5 s; httpx's default too).
KEEPALIVE_EXPIRY_S = 5.0
#: Idle connections kept per server.
KEEPALIVE_MAX = 512
#: Bytes of a ``GET`` answer read (``/api/tags``, ``/api/ps``).
GET_MAX = 16 << 20
#: Pieces of an answer queued before reading from the server pauses, and after
#: which it resumes.
_HIGH = 64
#: Bodies up to this many bytes are sent in one write with the request's head.
_JOINED_MAX = 256 << 10
#: Bytes an answer's head (status line and headers) may take, and bytes of its body
#: read before the front chose how to read it (then reading pauses).
HEAD_MAX = 64 << 10

Headers = Sequence[tuple[bytes, bytes]]


def _expire(fut: asyncio.Future[None], timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(UpstreamTimeout(f"nothing from the server in {timeout_s:g} s"))


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection to a server, one request at a time; the httptools
    parser's callbacks fill in the answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._lost_by: Exception | None = None
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self.reset()

    def reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = self.complete = self.paused = self.keep_alive = False
        self.pieces: collections.deque[bytes] = collections.deque()
        self.error: UpstreamError | None = None
        self._head = b""
        #: The body's bytes that came before the reader chose how to read them (None:
        #: chosen, and fed to the parser or the pipe as they come).
        self.held: bytes | None = None
        self.pipe: Piped | None = None

    # ---------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a TCP transport: asyncio's, or uvloop's (not an asyncio.Transport subclass,
        # the same methods)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.pipe is not None:
            self.pipe.received(data)
        elif self.held is not None:
            self.held += data
            if len(self.held) > HEAD_MAX and not self.paused and self.transport is not None:
                self.paused = True  # nobody reads yet: the server waits
                self.transport.pause_reading()
        elif self.head_done:
            self._parse(data)
        else:
            self._head_received(data)

    def _head_received(self, data: bytes) -> None:
        """Parse the head once it is whole; hold the body's bytes that came with it."""
        data = self._head + data
        end = data.find(b"\r\n\r\n")
        if end < 0:
            self._head = data
            if len(data) > HEAD_MAX:
                self.fail(UpstreamError(f"the server's answer has a head over {HEAD_MAX} bytes"))
                self.close()
            return
        self._head = b""
        self._parse(data[: end + 4])
        if not self.head_done and self.error is None:  # a 1xx: the answer's head is next
            self._head_received(data[end + 4 :])
            return
        self.held = data[end + 4 :]
        self.wake()

    def read_parsed(self) -> None:
        """From now on the body goes through the parser (:meth:`pieces_of_body`)."""
        held, self.held = self.held, None
        if held:
            self._parse(held)
        if self.lost:
            self.ended()
        elif self.paused and not self.pieces and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _parse(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.fail(UpstreamError(f"the server's answer is not HTTP/1.1: {e}"))
            self.close()
            return
        if len(self.pieces) > _HIGH and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._lost_by = exc
        if self.held is None:  # else the reader, once it chose how to read, ends it
            self.ended()
        self.wake()

    def ended(self) -> None:
        """The connection closed: the answer is complete, or failed."""
        exc = self._lost_by
        if self.pipe is not None:
            self.pipe.lost(exc)
        elif self.complete:
            pass
        elif self.head_done and self._until_eof():
            self.complete = True  # a body without a length ends with the connection
        elif not self.head_done:
            self.fail(UpstreamDropped("the server closed the connection without an answer"))
        else:
            self.fail(UpstreamError(f"the server closed the connection mid-answer ({exc})"))

    # ---------------------------------------------------------- parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()  # the message's end may say again

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # reset once the message ended

    # ---------------------------------------------------------- the request
    def _until_eof(self) -> bool:
        names = {k.lower() for k, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout_s: float, since: Callable[[], float] | None = None) -> None:
        """Until the server sends something (or, with ``since``, until the pipe wakes
        this: its end, a failure, a pause), or it closes (:data:`error` is set).

        Raises:
            UpstreamTimeout: nothing in ``timeout_s`` (since ``since()``, the loop
                time the last piece came, when given: one timer, re-armed while
                pieces come, instead of one per piece).
        """
        loop = asyncio.get_running_loop()
        self._waiter = fut = loop.create_future()

        def due() -> None:
            quiet = 0.0 if since is None else loop.time() - since()
            if since is None or quiet >= timeout_s:
                _expire(fut, timeout_s)
            else:
                timers.append(loop.call_later(timeout_s - quiet, due))

        timers = [loop.call_later(timeout_s, due)]
        try:
            await fut
        finally:
            timers[-1].cancel()
            self._waiter = None

    async def head(self, timeout_s: float) -> None:
        """Wait for the answer's head (status and headers)."""
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self.wait(timeout_s)

    async def pieces_of_body(self, timeout_s: float) -> AsyncGenerator[bytes]:
        """The body's bytes as they arrive (what arrived together, joined)."""
        while True:
            if self.pieces:
                piece = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
                self.pieces.clear()
                if self.paused and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                yield piece
            elif self.complete:
                return
            elif self.error is not None:
                raise self.error
            else:
                await self.wait(timeout_s)

    def reusable(self) -> bool:
        """The answer was read to its end and the server keeps the connection."""
        return (
            self.complete
            and not self.lost
            and self.error is None
            and not self.pieces
            and not self.held
            and self.keep_alive
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Answer:
    """A server's answer: its head, and its body as it arrives (:meth:`chunks`).

    Close it (:meth:`aclose`): a body read to its end gives the connection back
    to its pool; one not read through closes it, which is how the server learns
    that the client went away.
    """

    def __init__(self, conn: _Conn, pool: _Pool) -> None:
        self._conn = conn
        self._pool: _Pool | None = pool
        self.status: int = conn.status
        self.headers: list[tuple[bytes, bytes]] = conn.headers

    def header(self, name: bytes) -> bytes:
        """The first value of header ``name`` (lower case), ``b""`` when absent."""
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return b""

    def chunks(self) -> AsyncGenerator[bytes]:
        """The body's bytes as they arrive, unchanged (no content decoding).

        Raises:
            UpstreamError: the server died or stalled (``UpstreamTimeout``) midway.
        """
        pool = self._pool
        assert pool is not None  # read after aclose: a bug of ours
        self._conn.read_parsed()
        return self._conn.pieces_of_body(pool.read_timeout_s)

    @property
    def chunked(self) -> bool:
        """The body comes in HTTP/1.1 chunked framing (and nothing else)."""
        return self.header(b"transfer-encoding").strip().lower() == b"chunked"

    def pipe_counter(self) -> PipeCounter | None:
        """What :meth:`pipe` counted so far (None: not piped)."""
        piped = self._conn.pipe
        return piped.counter if piped is not None else None

    async def pipe(self, sink: ClientSocket) -> PipeCounter:
        """Pass the body, a :attr:`chunked` one, to ``sink`` as it arrives, in its
        framing less the last chunk (:mod:`.pipe`); the tokens it counted.

        Raises:
            UpstreamError: as :meth:`chunks`, and a broken chunked framing.
        """
        pool = self._pool
        assert pool is not None  # piped after aclose: a bug of ours
        conn = self._conn
        piped = conn.pipe = Piped(conn, sink, asyncio.get_running_loop(), pool.flush_interval_s)
        held, conn.held = conn.held, None
        return await piped.run(held, pool.read_timeout_s)

    async def aclose(self) -> None:
        """Give the connection back (kept alive) or close it (a body not read through)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release(self._conn)


class _Pool:
    """One server's kept-alive connections (event loop thread only)."""

    def __init__(self, base_url: str, read_timeout_s: float, flush_interval_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise UpstreamRefused(f"{base_url!r}: the front reaches only http://host:port servers")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc.encode("ascii")
        self.read_timeout_s = read_timeout_s
        self.flush_interval_s = flush_interval_s
        self.idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, conn = await loop.create_connection(_Conn, self.host, self.port)
        except TimeoutError:
            raise UpstreamTimeout(f"no connection in {CONNECT_TIMEOUT_S:g} s") from None
        except OSError as e:
            raise UpstreamRefused(f"{type(e).__name__}: {e.strerror or e}") from None
        return conn

    def _kept(self) -> _Conn | None:
        """The most recently used idle connection still open and fresh."""
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                return conn
            conn.close()
        return None

    async def send(self, method: str, path: str, headers: Headers, body: bytes) -> Answer:
        conn = self._kept() or await self._connect()
        head = [
            f"{method} {path} HTTP/1.1\r\n".encode("ascii"),
            b"host: ",
            self.authority,
            b"\r\ncontent-length: ",
            str(len(body)).encode("ascii"),
            b"\r\n",
        ]
        for k, v in headers:
            head += (k, b": ", v, b"\r\n")
        head.append(b"\r\n")
        assert conn.transport is not None  # set once connected
        try:
            if len(body) <= _JOINED_MAX:
                conn.transport.write(b"".join([*head, body]))  # one write, one packet
            else:
                conn.transport.write(b"".join(head))
                conn.transport.write(body)
            await conn.head(self.read_timeout_s)
        except BaseException:
            conn.close()
            raise
        return Answer(conn, self)

    def release(self, conn: _Conn) -> None:
        if conn.reusable() and len(self.idle) < KEEPALIVE_MAX:
            conn.reset()
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class Upstreams:
    """A pool of connections per base URL (event loop thread only)."""

    def __init__(self, read_timeout_s: float, flush_interval_s: float = 0.0) -> None:
        self.read_timeout_s = read_timeout_s
        self.flush_interval_s = flush_interval_s
        self._pools: dict[str, _Pool] = {}

    def _pool(self, base_url: str) -> _Pool:
        found = self._pools.get(base_url)
        if found is None:
            found = self._pools[base_url] = _Pool(
                base_url, self.read_timeout_s, self.flush_interval_s
            )
        return found

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> Answer:
        """Send a request to the server at ``base_url`` (``http://host:port``) on a
        kept-alive connection or a new one; the answer once its head arrived (read
        its body with :meth:`Answer.chunks`, then :meth:`Answer.aclose` it).

        ``headers`` go as they are, after ``host`` and ``content-length``; ``path``
        is sent as it is (the front's own route paths).

        Raises:
            UpstreamError: no connection (``UpstreamRefused``), none or no answer
                in time (``UpstreamTimeout``, the connect's 5 s or the read
                timeout), the connection closed before the answer
                (``UpstreamDropped``), or an answer that is not HTTP/1.1.
        """
        return await self._pool(base_url).send(method, path, headers, body)

    async def get_json(self, base_url: str, path: str) -> Any:
        """The JSON document the server answers ``GET path`` with; None when its
        status is not 200 or its body is not JSON.

        Raises:
            UpstreamError: as :meth:`send`; also an answer over :data:`GET_MAX` bytes.
        """
        answer = await self.send(base_url, "GET", path, [(b"accept", b"application/json")], b"")
        try:
            if answer.status != 200:
                return None
            body = bytearray()
            async with contextlib.aclosing(answer.chunks()) as chunks:
                async for chunk in chunks:
                    body += chunk
                    if len(body) > GET_MAX:
                        raise UpstreamError(f"GET {path}: an answer over {GET_MAX} bytes")
        finally:
            await answer.aclose()
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            return None

    async def aclose(self) -> None:
        """Close every idle connection (those in use close as their answers end)."""
        pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()
