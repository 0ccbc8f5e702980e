"""The interface every chain store implements (SQLite on disk, memory for tests)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from types import TracebackType
from typing import Protocol, Self

from infervisor.chain.records import EventDraft, StoredEvent

KindFilter = Collection[str] | None
"""The ``kinds`` argument of `Chain.events`: the kinds wanted (None: any kind; a
single str is refused, see `kinds_filter`)."""


class Chain(Protocol):
    """An append-only, hash-chained event log of one node.

    Implementations: `SqliteChain` (the real one) and `MemoryChain` (tests).
    One contract test suite runs against both.
    """

    @property
    def node_id(self) -> str:
        """The node whose chain this is (named by the genesis event)."""
        ...

    def append(self, draft: EventDraft) -> StoredEvent:
        """Append one event; durable when it returns. See `append_many`."""
        ...

    def append_many(self, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        """Append events in order, all or none, in one transaction (group commit).

        Returns:
            The stored events, in the order of `drafts`.

        Raises:
            InvalidEventError: a draft cannot be stored; nothing was appended.
            ChainIntegrityError: the append would fork or gap the chain.
            ChainIOError: the store cannot be written (or is closed or read-only).
        """
        ...

    def head(self) -> StoredEvent:
        """Return the event with the highest seq (genesis in a new chain)."""
        ...

    def events(
        self, *, after: int = -1, subject: str | None = None, kinds: KindFilter = None
    ) -> Iterator[StoredEvent]:
        """Yield events with seq > `after`, ordered by seq, streamed.

        Args:
            after: only events with a greater seq (-1: from genesis).
            subject: only events of this subject ("" for node-level events).
            kinds: only events whose kind is in this collection.
        """
        ...

    def close(self) -> None:
        """Release the store; idempotent. Later calls raise `ChainIOError`."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Closing:
    """``with store:`` closes the store on the way out (both stores use it)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def kinds_filter(kinds: KindFilter) -> frozenset[str] | None:
    """Return the `kinds` argument of `Chain.events` as a set (None: any kind).

    Raises:
        TypeError: `kinds` is a single str (which would match its characters).
    """
    if kinds is None:
        return None
    if isinstance(kinds, str):
        raise TypeError(f"kinds must be a collection of kinds, not the str {kinds!r}")
    return frozenset(kinds)
