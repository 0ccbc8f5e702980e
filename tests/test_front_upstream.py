"""The front's HTTP/1.1 client (tools/front/upstream.py) against small asyncio
servers of this file that write raw answers: a kept-alive connection is used
again, a stream's pieces arrive as sent, a body without a length ends with the
connection, and each failure has its own error (refused, dropped, timed out).

What each test proves is in its name; the front's own use of them (502, 504,
backpressure, a client's disconnect) is in tests/test_front.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

import pytest

from infervisor.adapters.ports import free_port
from infervisor.tools.front.upstream import (
    UpstreamDropped,
    UpstreamError,
    UpstreamRefused,
    Upstreams,
    UpstreamTimeout,
)

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
#: A part that closes the connection.
CLOSE = b""
Answer = Callable[[int], AsyncIterator[bytes]]


class Served:
    """What a test server saw: connections opened, and each request's bytes."""

    def __init__(self) -> None:
        self.connections = 0
        self.ended = 0  # connections the server saw end
        self.requests: list[bytes] = []


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    sizes = [
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    ]
    return head + await reader.readexactly(sizes[0] if sizes else 0)


@contextlib.asynccontextmanager
async def server(answer: Answer) -> AsyncIterator[tuple[str, Served]]:
    """``(http://127.0.0.1:PORT, served)`` of a server that writes the parts
    ``answer(n)`` yields for the n-th request of a connection (:data:`CLOSE`
    closes it)."""
    served = Served()
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.connections += 1
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            for n in itertools.count(1):
                served.requests.append(await _request(reader))
                async for part in answer(n):
                    if part == CLOSE:
                        return
                    writer.write(part)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test ended (cancelled: ends quietly)
        finally:
            served.ended += 1
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", served
    finally:
        srv.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


async def whole(up: Upstreams, base: str) -> tuple[int, bytes]:
    answer = await up.send(base, "POST", "/x", [(b"content-type", b"application/json")], b"{}")
    try:
        body = b"".join([chunk async for chunk in answer.chunks()])
    finally:
        await answer.aclose()
    return answer.status, body


async def ok(n: int) -> AsyncIterator[bytes]:
    yield OK


def test_a_kept_alive_connection_is_used_again_and_the_request_is_one_write() -> None:
    async def run() -> None:
        async with server(ok) as (base, served):
            up = Upstreams(10.0)
            assert await whole(up, base) == (200, b"{}")
            assert await whole(up, base) == (200, b"{}")
            assert served.connections == 1 and len(served.requests) == 2
            first = served.requests[0]
            assert first.startswith(b"POST /x HTTP/1.1\r\nhost: 127.0.0.1:")
            assert b"content-length: 2\r\n" in first and first.endswith(b"\r\n\r\n{}")
            await up.aclose()

    asyncio.run(run())


def test_a_stream_arrives_piece_by_piece_and_one_left_midway_closes_its_connection() -> None:
    async def run() -> None:
        gate = asyncio.Event()

        async def stream(n: int) -> AsyncIterator[bytes]:
            yield (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n"
            )
            await gate.wait()
            yield b"5\r\nnext!\r\n0\r\n\r\n"

        async with server(stream) as (base, served):
            up = Upstreams(10.0)
            answer = await up.send(base, "POST", "/s", [], b"")
            assert answer.status == 200 and answer.header(b"content-type") == b"text/event-stream"
            pieces = answer.chunks()
            assert await anext(pieces) == b"data: "  # before the server ended its answer
            gate.set()
            assert [p async for p in pieces] == [b"next!"]
            await answer.aclose()  # read through: kept
            answer = await up.send(base, "POST", "/s", [], b"")
            assert served.connections == 1
            await answer.aclose()  # left before its end: closed, so the server stops
            gate.clear()
            answer = await up.send(base, "POST", "/s", [], b"")
            assert served.connections == 2
            await answer.aclose()
            await up.aclose()

    asyncio.run(run())


def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async def until_eof(n: int) -> AsyncIterator[bytes]:
        yield b'HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"models": []}'
        yield CLOSE

    async def run() -> None:
        async with server(until_eof) as (base, _):
            up = Upstreams(10.0)
            assert await up.get_json(base, "/api/ps") == {"models": []}
            await up.aclose()

    asyncio.run(run())


def test_failures_are_refused_dropped_or_timed_out() -> None:
    async def run() -> None:
        up = Upstreams(0.3)
        with pytest.raises(UpstreamRefused):
            await up.send(f"http://127.0.0.1:{free_port()}", "POST", "/x", [], b"")

        async def drop(n: int) -> AsyncIterator[bytes]:
            yield CLOSE

        async with server(drop) as (base, _):
            with pytest.raises(UpstreamDropped):
                await up.send(base, "POST", "/x", [], b"")

        async def silent(n: int) -> AsyncIterator[bytes]:
            await asyncio.Event().wait()  # never answers
            yield OK

        async with server(silent) as (base, _):
            with pytest.raises(UpstreamTimeout):
                await up.send(base, "POST", "/x", [], b"")

        async def garbage(n: int) -> AsyncIterator[bytes]:
            yield b"NOT HTTP\r\n\r\n"

        async with server(garbage) as (base, _):
            with pytest.raises(UpstreamError):
                await up.send(base, "POST", "/x", [], b"")
        await up.aclose()

    asyncio.run(run())


def test_a_stream_not_taken_stops_being_read_so_the_servers_socket_fills() -> None:
    """Backpressure: while nobody takes the pieces, at most 64 (and what one read
    brings) are queued, reading stops and the server's writes back up, instead
    of the whole answer being read into memory."""
    piece = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"  # 16 KiB chunks
    backed_up = asyncio.Event()
    sent = [0]

    async def flood(n: int) -> AsyncIterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        for _ in range(4096):  # 64 MiB at most: far more than the sockets hold
            yield piece
            sent[0] += 1

    async def run() -> None:
        async with server(flood) as (base, _):
            up = Upstreams(30.0)
            answer = await up.send(base, "POST", "/s", [], b"")
            answer.chunks()  # read through the parser, and not taken
            conn = answer._conn
            while not backed_up.is_set():
                await asyncio.sleep(0.01)  # let the loop run: the server writes, we read
                if conn.paused:
                    backed_up.set()
            queued = len(conn.pieces)
            assert queued < 100  # 64, and what the last read brought (16 per 256 KiB)
            for _ in range(100):  # the server goes on only while the sockets take it
                await asyncio.sleep(0)
            assert sent[0] < 4096 and len(conn.pieces) == queued
            await answer.aclose()
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


# --- the pipe (tools/front/pipe.py): a chunked body passed on unparsed ------------------

SSE = [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(3)]
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Sink:
    """The client's socket as the pipe sees it: takes what is written; ``full``
    says its buffer is over its high-water mark (the pipe then waits in drain)."""

    def __init__(self) -> None:
        self.got = bytearray()
        self.writes: list[bytes] = []
        self.writable = asyncio.Event()
        self.writable.set()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.got += data
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    @property
    def write_paused(self) -> bool:
        return not self.writable.is_set()

    async def drain(self) -> None:
        await self.writable.wait()


def test_a_chunked_stream_is_piped_in_its_framing_less_the_last_chunk_and_kept_alive() -> None:
    """The client gets the server's chunks byte for byte (the front writes the last
    chunk itself), the tokens are counted, and the connection is used again."""

    async def stream(n: int) -> AsyncIterator[bytes]:
        yield CHUNKED_HEAD + chunk(SSE[0])
        yield chunk(SSE[1])[:3]  # a size line split between two reads
        yield chunk(SSE[1])[3:] + chunk(SSE[2]) + b"0\r\n"
        yield b"\r\n"

    async def run() -> None:
        async with server(stream) as (base, served):
            up = Upstreams(30.0)
            for _ in range(2):
                answer = await up.send(base, "POST", "/s", [], b"")
                sink = Sink()
                assert answer.chunked
                counted = await answer.pipe(sink)
                await answer.aclose()
                assert bytes(sink.got) == b"".join(chunk(e) for e in SSE)
                assert counted.close().completion == 3
            assert served.connections == 1
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_after_the_first_token_the_pieces_of_a_flush_interval_go_on_in_one_write() -> None:
    """``[front] stream_flush_interval_s``: the first token is written the moment it
    comes; the server's socket is then not read until the interval is over, and the
    pieces it sent meanwhile reach the client in one write."""
    gate = asyncio.Event()

    async def fast(n: int) -> AsyncIterator[bytes]:
        yield CHUNKED_HEAD + chunk(SSE[0])
        await gate.wait()  # the pipe holds its reading back: three more writes of the server
        yield chunk(SSE[1])
        yield chunk(SSE[2])
        yield b"0\r\n\r\n"

    async def run() -> None:
        async with server(fast) as (base, _):
            up = Upstreams(30.0, flush_interval_s=0.5)
            answer = await up.send(base, "POST", "/s", [], b"")
            sink = Sink()
            task = asyncio.ensure_future(answer.pipe(sink))
            while answer._conn.pipe is None or answer._conn.pipe.held_back is None:
                await asyncio.sleep(0.005)
            assert sink.writes == [chunk(SSE[0])]  # the first token was not held
            gate.set()
            counted = await task
            assert sink.writes == [chunk(SSE[0]), chunk(SSE[1]) + chunk(SSE[2])]
            assert counted.close().completion == 3
            await answer.aclose()
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_pipe_left_while_its_reading_is_held_back_leaves_no_timer() -> None:
    """A request cancelled inside a flush interval cancels its timer: it would
    otherwise resume reading a connection that may serve another request."""

    async def stalls(n: int) -> AsyncIterator[bytes]:
        yield CHUNKED_HEAD + chunk(SSE[0])
        await asyncio.Event().wait()

    async def run() -> None:
        async with server(stalls) as (base, _):
            up = Upstreams(30.0, flush_interval_s=30.0)
            answer = await up.send(base, "POST", "/s", [], b"")
            task = asyncio.ensure_future(answer.pipe(Sink()))
            while answer._conn.pipe is None or answer._conn.pipe.held_back is None:
                await asyncio.sleep(0.005)
            timer = answer._conn.pipe.held_back
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert timer.cancelled() and answer._conn.pipe.held_back is None
            await answer.aclose()
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


async def endless(n: int) -> AsyncIterator[bytes]:
    yield CHUNKED_HEAD
    while True:  # text in each piece: a flush interval holds reading back after it
        yield chunk(SSE[0] + b"x" * 0x4000)


@pytest.mark.parametrize("flush_interval_s", [0.0, 0.01])
def test_a_piped_stream_stops_being_read_while_the_client_is_full(
    flush_interval_s: float,
) -> None:
    """Backpressure: while the client's socket is full the server's is not read (its
    writes back up); once the client drains, the stream goes on. With a flush
    interval too: a full client's pause comes first, and no timer reads meanwhile."""

    async def run() -> None:
        async with server(endless) as (base, _):
            up = Upstreams(30.0, flush_interval_s)
            answer = await up.send(base, "POST", "/s", [], b"")
            sink = Sink()
            sink.writable.clear()  # full from the start
            task = asyncio.ensure_future(answer.pipe(sink))
            while not answer._conn.paused:
                await asyncio.sleep(0.01)
            before = len(sink.got)
            for _ in range(50):
                await asyncio.sleep(0.005)
            assert len(sink.got) == before  # nothing read while paused
            assert answer._conn.pipe is not None and answer._conn.pipe.held_back is None
            sink.writable.set()
            while len(sink.got) < before + (1 << 20):  # goes on once drained
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await answer.aclose()
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


@pytest.mark.parametrize("how", ["cancelled", "client closing"])
def test_a_piped_stream_left_midway_closes_the_servers_connection(how: str) -> None:
    """A client gone (the request cancelled, or its socket closing as a piece
    comes) closes the server's connection: the server sees it end."""

    async def run() -> None:
        async with server(endless) as (base, served):
            up = Upstreams(30.0)
            answer = await up.send(base, "POST", "/s", [], b"")
            sink = Sink()
            task = asyncio.ensure_future(answer.pipe(sink))
            while len(sink.got) < 0x10000:
                await asyncio.sleep(0.01)
            if how == "cancelled":
                task.cancel()
            else:
                sink.closing = True
            with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                await task
            await answer.aclose()
            while served.ended < 1:
                await asyncio.sleep(0.01)
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_broken_chunked_framing_fails_the_pipe() -> None:
    async def broken(n: int) -> AsyncIterator[bytes]:
        yield CHUNKED_HEAD + chunk(SSE[0]) + b"zz\r\n"

    async def run() -> None:
        async with server(broken) as (base, _):
            up = Upstreams(30.0)
            answer = await up.send(base, "POST", "/s", [], b"")
            with pytest.raises(UpstreamError, match="framing"):
                await answer.pipe(Sink())
            await answer.aclose()
            await up.aclose()

    asyncio.run(asyncio.wait_for(run(), 60))
