"""The chain append seam: the one place that turns events into an append.

Every executor (the instance actor, the host's workers, the node, the
supervisor) records its decisions through a :class:`ChainAppend`. The real one,
:class:`WriterAppend`, builds the drafts (timestamp, source, kind, subject,
canonical payload) and asks the node's :class:`~.chain_writer.ChainWriter`,
which answers once the events are durable (one transaction per call, shared
with whatever else is queued: group commit). Its fake,
:class:`~.append_fake.FakeAppend`, keeps the events in memory and can be made
to refuse or to hang, for tests of the actors that need only an append.

Errors: whatever failed the transaction (a
:class:`~infervisor.chain.ChainError`: the disk full, the write lock held past
the busy timeout), ``pykka.ActorDeadError`` when the writer is gone, and
``pykka.Timeout`` when a blocking append is not answered within its timeout.
Nothing of a failed append is stored (the writer's transaction is all or
nothing), so its caller must run no effect of the decision.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import pykka

from infervisor.chain import EventDraft, StoredEvent
from infervisor.replay import events as ev
from infervisor.replay import kind_of

from .clock import Clock
from .messages import Append

__all__ = [
    "APPEND_TIMEOUT_S",
    "APPEND_WARN_S",
    "ChainAppend",
    "Entry",
    "WriterAppend",
    "durable",
]

log = logging.getLogger(__name__)

#: The longest a blocking append waits for the writer by default, seconds.
APPEND_TIMEOUT_S = 60.0
#: An append waited on without a limit is logged after this many seconds unanswered.
APPEND_WARN_S = 60.0


class Entry(NamedTuple):
    """One event of a batch whose events have different subjects or sources."""

    event: ev.Event
    source: str
    subject: str = ""


class ChainAppend(abc.ABC):
    """Records events in the chain, durable before it answers (real or fake).

    Subclasses give :meth:`submit_batch`; the rest is built on it.
    """

    def append(
        self,
        events: Sequence[ev.Event],
        *,
        source: str,
        subject: str = "",
        ts_ns: int | None = None,
        timeout_s: float | None = APPEND_TIMEOUT_S,
    ) -> tuple[StoredEvent, ...]:
        """Append ``events`` in one transaction, blocking until durable; their
        stored records, in order.

        Args:
            events: what to record (may be empty: nothing is asked, () answered).
            source: who decided ("operator", "supervisor", "node", ...).
            subject: the instance id, or "" for a node-level event.
            ts_ns: the decision's wall-clock time, ns since the Unix epoch, UTC
                (None: the clock's now).
            timeout_s: seconds to wait for the answer; None waits until the
                writer answers (logged every :data:`APPEND_WARN_S`), for a caller
                that must never take again a decision that may yet commit.

        Raises:
            ChainError, pykka.ActorDeadError, pykka.Timeout: see the module docstring.
        """
        entries = [Entry(event, source, subject) for event in events]
        return self.append_batch(entries, ts_ns=ts_ns, timeout_s=timeout_s)

    def append_batch(
        self,
        entries: Sequence[Entry],
        *,
        ts_ns: int | None = None,
        timeout_s: float | None = APPEND_TIMEOUT_S,
    ) -> tuple[StoredEvent, ...]:
        """Like :meth:`append`, for events of several subjects or sources (one
        transaction: all of them are stored, or none)."""
        if not entries:
            return ()
        answer = self.submit_batch(entries, ts_ns=ts_ns)
        return durable(answer, timeout_s, what=entries[0].subject or entries[0].source)

    def submit(
        self,
        events: Sequence[ev.Event],
        *,
        source: str,
        subject: str = "",
        ts_ns: int | None = None,
    ) -> pykka.Future[list[StoredEvent]]:
        """Ask for the append of ``events`` without waiting (see :meth:`submit_batch`)."""
        entries = [Entry(event, source, subject) for event in events]
        return self.submit_batch(entries, ts_ns=ts_ns)

    @abc.abstractmethod
    def submit_batch(
        self, entries: Sequence[Entry], *, ts_ns: int | None = None
    ) -> pykka.Future[list[StoredEvent]]:
        """Ask for the append without waiting: the Future answers the stored
        records once durable, in order, or raises the append's error.

        Raises:
            pykka.ActorDeadError: the writer is gone (nothing was asked).
        """


class WriterAppend(ChainAppend):
    """The real :class:`ChainAppend`: drafts asked of the node's chain writer.

    Args:
        writer: the :class:`~.chain_writer.ChainWriter`'s ref.
        clock: stamps an append given no ``ts_ns`` (its wall clock).
    """

    def __init__(self, writer: pykka.ActorRef[Any], clock: Clock) -> None:
        self.writer = writer
        self.clock = clock

    def submit_batch(
        self, entries: Sequence[Entry], *, ts_ns: int | None = None
    ) -> pykka.Future[list[StoredEvent]]:
        """See :meth:`ChainAppend.submit_batch`."""
        at = self.clock.wall_ns() if ts_ns is None else ts_ns
        drafts = tuple(
            EventDraft(
                ts_ns=at,
                source=e.source,
                kind=kind_of(e.event),
                subject=e.subject,
                payload=ev.encode_event(e.event),
            )
            for e in entries
        )
        answer: pykka.Future[list[StoredEvent]] = self.writer.ask(
            Append(drafts=drafts), block=False
        )
        return answer


def durable(
    answer: pykka.Future[list[StoredEvent]], timeout_s: float | None, what: str = "an append"
) -> tuple[StoredEvent, ...]:
    """The stored records an append's Future answers, waiting up to ``timeout_s``
    seconds (None: until it answers, warning every :data:`APPEND_WARN_S`).

    Never giving up matters to the instance actor: an append the writer still
    holds may yet commit, and a decision taken again after it did would be
    recorded twice. A writer's transaction waits at most ``BUSY_TIMEOUT_S`` for
    the write lock; a writer that stops fails the Future (``ActorDeadError``).

    Raises:
        The append's error; pykka.Timeout: not answered within ``timeout_s``.
    """
    if timeout_s is not None:
        return tuple(answer.get(timeout=timeout_s))
    while True:
        try:
            return tuple(answer.get(timeout=APPEND_WARN_S))
        except pykka.Timeout:
            log.warning(
                "%s: the chain writer has not answered an append for %g s; waiting on",
                what, APPEND_WARN_S,
            )  # fmt: skip
