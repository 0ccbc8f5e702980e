"""The watch stream: chain events as they are appended, resumable by seq.

The stream reads the chain file itself (a read-only connection per batch),
never the node's memory: what it sends is what is durable, in seq order, and
a client that reconnects with the last seq it saw (SSE ``Last-Event-ID``, or
``?from_seq=`` one past it) gets every later event exactly once. The
:class:`WatchHub` only wakes the streams when the chain writer reports a
durable event, so an idle stream costs nothing but a keep-alive comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
import msgspec

from infervisor.chain import StoredEvent
from infervisor.chain.connect import connect_reader
from infervisor.chain.schema import SELECT_EVENTS, to_event

from .wire import WatchEvent

__all__ = ["BATCH", "KEEPALIVE_S", "WatchHub", "read_after", "stream_events", "watch_event"]

#: Rows read per query.
BATCH = 500
#: Seconds of silence after which a stream reads the chain again and sends an SSE
#: comment (keeps proxies open; recovers a wake-up the observer dropped).
KEEPALIVE_S = 5.0


def read_after(chain_path: Path, from_seq: int, limit: int = BATCH) -> list[WatchEvent]:
    """Up to ``limit`` durable events with ``seq >= from_seq``, in seq order."""
    conn = connect_reader(str(chain_path))
    try:
        query = SELECT_EVENTS + " WHERE seq >= ? ORDER BY seq LIMIT ?"
        rows = conn.execute(query, (from_seq, limit)).fetchall()
    finally:
        conn.close()
    return [watch_event(to_event(row)) for row in rows]


def watch_event(stored: StoredEvent) -> WatchEvent:
    """A stored event as the stream sends it: the payload decoded, the hashes hex."""
    return WatchEvent(
        seq=stored.seq,
        ts_ns=stored.ts_ns,
        node=stored.node,
        source=stored.source,
        kind=stored.kind,
        subject=stored.subject,
        payload=msgspec.json.decode(stored.payload),
        hash=stored.hash.hex(),
        prev_hash=stored.prev_hash.hex(),
    )


class WatchHub:
    """Wakes the streams on the server's event loop when the chain grows.

    :meth:`notify` is called from the chain writer's observer thread;
    :meth:`wait` is awaited on the server's loop.
    """

    def __init__(self, head: int) -> None:
        self._head = head
        self._closed = False
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()

    @property
    def closed(self) -> bool:
        """True once the server stops: streams end."""
        return self._closed

    def notify(self, seq: int) -> None:
        """The chain holds ``seq`` now (any thread)."""
        with self._lock:
            self._head = max(self._head, seq)
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(_resolve, fut)

    def close(self) -> None:
        """End every stream (any thread)."""
        self._closed = True
        self.notify(self._head)

    async def wait(self, seq: int, timeout_s: float) -> bool:
        """True once the chain holds ``seq`` (or the hub closes); False after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._head >= seq or self._closed:
                return True
            self._waiters.add((loop, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            with self._lock:
                self._waiters.discard((loop, fut))
            return False
        return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def stream_events(
    chain_path: Path, hub: WatchHub, from_seq: int, *, follow: bool
) -> AsyncIterator[WatchEvent | None]:
    """Every event from ``from_seq`` on; with ``follow``, then each new one as it
    becomes durable, and ``None`` after each :data:`KEEPALIVE_S` of silence."""
    next_seq = from_seq
    while not hub.closed:
        batch = await anyio.to_thread.run_sync(read_after, chain_path, next_seq)
        for event in batch:
            yield event
        if batch:
            next_seq = batch[-1].seq + 1
            continue
        if not follow:
            return
        if not await hub.wait(next_seq, KEEPALIVE_S):
            yield None
