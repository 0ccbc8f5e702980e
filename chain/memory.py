"""`MemoryChain`: the chain interface held in a list, for fast tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

from infervisor.chain.errors import ChainIOError
from infervisor.chain.hashing import seal_after, seal_genesis
from infervisor.chain.records import (
    EventDraft,
    StoredEvent,
    check_drafts,
    check_node_id,
)
from infervisor.chain.store import Closing, KindFilter, kinds_filter


class MemoryChain(Closing):
    """An in-memory chain with the same contract as `SqliteChain`.

    Nothing is durable. Thread-safe: appends are serialised by a lock;
    `events()` iterates a snapshot taken when it is called.
    """

    def __init__(self, node_id: str, *, now_ns: Callable[[], int] = time.time_ns) -> None:
        """Create a chain holding only the genesis event of `node_id`.

        Args:
            node_id: the node whose chain this is.
            now_ns: clock for the genesis timestamp, ns since the Unix epoch, UTC.

        Raises:
            InvalidEventError: `node_id` is empty or not valid UTF-8.
        """
        self.node_id = check_node_id(node_id)
        self._lock = threading.Lock()
        genesis = seal_genesis(node_id, now_ns())
        self._events = [genesis]
        self._closed = False

    def append(self, draft: EventDraft) -> StoredEvent:
        """Append one event. See `Chain.append_many` for errors."""
        return self.append_many([draft])[0]

    def append_many(self, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        """Append events in order, all or none. See `Chain.append_many`."""
        checked = check_drafts(drafts)
        with self._lock:
            self._check_open()
            stored = seal_after(self._events[-1], checked, self.node_id)
            self._events.extend(stored)
        return stored

    def head(self) -> StoredEvent:
        """Return the event with the highest seq."""
        with self._lock:
            self._check_open()
            return self._events[-1]

    def events(
        self, *, after: int = -1, subject: str | None = None, kinds: KindFilter = None
    ) -> Iterator[StoredEvent]:
        """Return events with seq > `after` matching the filters, by seq.

        The snapshot is taken now: events appended later are not yielded.

        Raises:
            ChainIOError: the chain is closed.
        """
        with self._lock:
            self._check_open()
            snapshot = self._events[max(after + 1, 0) :]
        wanted = kinds_filter(kinds)
        return (
            event
            for event in snapshot
            if (subject is None or event.subject == subject)
            and (wanted is None or event.kind in wanted)
        )

    def close(self) -> None:
        """Forget nothing, but refuse further use; idempotent."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ChainIOError("memory chain is closed")
