"""An in-memory :class:`~.append.ChainAppend` for tests of the actors.

It answers like the real append (stored records numbered from 1, in order, all
or nothing per call) without a writer or an SQLite file, and it can be told to
refuse every append (:meth:`FakeAppend.refuse`, as a full disk or a held write
lock makes the real one) or to hold them unanswered (:meth:`FakeAppend.hang`,
as a writer blocked on the lock does) until :meth:`FakeAppend.release`.
Records carry no hashes: a test that needs a verifiable chain uses the real
writer. Thread-safe: actors append from their own threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pykka

from infervisor.chain import StoredEvent
from infervisor.replay import events as ev
from infervisor.replay import kind_of

from .append import ChainAppend, Entry
from .clock import Clock

__all__ = ["FakeAppend"]


class FakeAppend(ChainAppend):
    """Stores appended events in memory; refuses or hangs on command.

    Attributes:
        stored: every record stored so far, in order.
        refused: how many appends were refused (a counter).
    """

    def __init__(self, clock: Clock, node_id: str = "node-test") -> None:
        self.clock = clock
        self.node_id = node_id
        self.stored: list[StoredEvent] = []
        self.refused = 0
        self._error: Exception | None = None
        self._hanging = False
        self._held: list[tuple[pykka.Future[list[StoredEvent]], list[StoredEvent]]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ control
    def refuse(self, error: Exception | None) -> None:
        """Fail every append with ``error`` from now on (None: take them again)."""
        with self._lock:
            self._error = error

    def hang(self) -> None:
        """Leave every append unanswered (and unstored) until :meth:`release`."""
        with self._lock:
            self._hanging = True

    def release(self) -> None:
        """Store and answer the appends held by :meth:`hang`, in order; answer
        later ones at once."""
        with self._lock:
            self._hanging = False
            held, self._held = self._held, []
            for answer, records in held:
                self.stored.extend(records)
                answer.set(records)

    def kinds(self, subject: str | None = None) -> list[str]:
        """The kinds stored (of one subject, when given), in order."""
        return [r.kind for r in self.stored if subject is None or r.subject == subject]

    # ------------------------------------------------------------------ ChainAppend
    def submit_batch(
        self, entries: Sequence[Entry], *, ts_ns: int | None = None
    ) -> pykka.Future[list[StoredEvent]]:
        """See :meth:`.append.ChainAppend.submit_batch`."""
        answer: pykka.Future[list[StoredEvent]] = pykka.ThreadingFuture()
        at = self.clock.wall_ns() if ts_ns is None else ts_ns
        with self._lock:
            error = self._error
            if error is None:
                records = self._records(entries, at)
                if self._hanging:
                    self._held.append((answer, records))
                    return answer
                self.stored.extend(records)
            else:
                self.refused += 1
        if error is not None:
            answer.set_exception((type(error), error, error.__traceback__))
        else:
            answer.set(records)
        return answer

    def _records(self, entries: Sequence[Entry], at: int) -> list[StoredEvent]:
        first = len(self.stored) + sum(len(records) for _, records in self._held) + 1
        return [
            StoredEvent(
                seq=first + i,
                ts_ns=at,
                node=self.node_id,
                source=e.source,
                kind=kind_of(e.event),
                subject=e.subject,
                payload=ev.encode_event(e.event),
                payload_hash=b"",
                prev_hash=b"",
                hash=b"",
            )
            for i, e in enumerate(entries)
        ]
