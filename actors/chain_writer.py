"""The chain writer: the only writer of the node's SQLite chain.

Group commit: an :class:`Append` that reaches the writer takes with it every
Append already waiting in the inbox, and all their drafts go into one
transaction (``SqliteChain.append_many``, one ``BEGIN IMMEDIATE`` ... ``COMMIT``).
Before it commits, the writer waits for the callers its last commit covered to
come back, for at most that commit's duration (:mod:`.commit_fill`: the rule,
and the inbox that wakes the writer once, when the batch is complete), so its
batches fill instead of settling at half the callers. Each asker is answered
only after that commit, with its own stored events (seqs and hashes) in the
order of its drafts: every answer is set, then the writer wakes the first
caller waiting and each woken caller the next (:mod:`.latch`: one wake-up on
the writer's thread, no herd of 32 threads at the GIL). An asker whose
drafts are invalid fails alone, before the transaction; a transaction that
fails fails every asker in it, and none of their events is stored.

The observer of appended events (``on_event``) runs on its own thread behind
a bounded buffer (:class:`~infervisor.actors.observer.EventObserver`): the
writer hands it each batch once durable and never waits for it.

With ``checkpoint_every_events`` set, the writer also signs checkpoints
(:class:`~infervisor.chain.checkpoint_store.Checkpointer`, the node key in the
chain's folder): every that many events, at the first commit
``checkpoint_every_s`` seconds after the last one, and when it stops. A
checkpoint that cannot be written is logged; the appends it follows stand.

With ``on_checkpoint`` given, each checkpoint signed while appending is handed
to it on the writer's thread (the node's witness submitters: a ``tell`` per
witness, so a witness never slows an append; :mod:`.witnessing`).

With ``health`` given (an :class:`~.append_health.AppendHealth`), the writer
reports each transaction's outcome there: the node's status and metrics say
from it whether the chain refuses writes (disk full, write lock held by
another process), and since when. A failed transaction is rolled back whole
(``chain.connect.immediate``) and the connection stays usable: the next
append after the disk has room again, or the lock was released, commits.

With ``latency`` given (a :class:`CommitLatency`), the writer records how long
each group commit's transaction took, from ``BEGIN`` to ``COMMIT`` done, in
seconds. The histogram is thread-safe and shared by reference, so a metrics
scrape reads it without asking the (possibly busy) writer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import pykka

from infervisor.chain import ChainError, EventDraft, InvalidEventError, SqliteChain, StoredEvent
from infervisor.chain.checkpoint import Checkpoint, load_or_create_signer
from infervisor.chain.checkpoint_store import DEFAULT_EVERY_S, Checkpointer
from infervisor.chain.records import check_drafts

from .append_health import AppendHealth
from .commit_fill import FillPolicy, WriterInbox
from .latch import Latch, answer_in_turn
from .messages import Append
from .observer import DEFAULT_CAPACITY, EventObserver

__all__ = ["COMMIT_BUCKETS_S", "ChainWriter", "CommitLatency", "LatencySnapshot"]

log = logging.getLogger(__name__)

#: Upper bounds of the commit latency histogram's buckets, seconds (+Inf is implied).
COMMIT_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class LatencySnapshot(NamedTuple):
    """A histogram read at one moment.

    Attributes:
        bounds: the buckets' upper bounds, seconds, ascending (without +Inf).
        cumulative: observations at or below each bound (same length as
            ``bounds``).
        observations: all observations (the +Inf bucket).
        sum_s: their total, seconds.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    observations: int
    sum_s: float


class CommitLatency:
    """A small thread-safe histogram of durations in seconds (fixed buckets).

    The chain writer observes each group commit's transaction time; anyone
    may read :meth:`snapshot` from any thread.
    """

    def __init__(self, bounds: tuple[float, ...] = COMMIT_BUCKETS_S) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly ascending")
        self._bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * len(self._bounds)  # per bucket, not cumulative
        self._count = 0
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Count one duration (seconds)."""
        index = next((i for i, b in enumerate(self._bounds) if seconds <= b), None)
        with self._lock:
            if index is not None:
                self._counts[index] += 1
            self._count += 1
            self._sum += seconds

    def snapshot(self) -> LatencySnapshot:
        """The buckets (cumulative), count and sum, read together."""
        with self._lock:
            counts, count, total = list(self._counts), self._count, self._sum
        cumulative: list[int] = []
        running = 0
        for c in counts:
            running += c
            cumulative.append(running)
        return LatencySnapshot(self._bounds, tuple(cumulative), count, total)


class _Ask(NamedTuple):
    """One Append of a group: its drafts and where its answer goes (None: the first)."""

    drafts: list[EventDraft]
    reply_to: pykka.Future[Any] | None


class ChainWriter(pykka.ThreadingActor):
    """Appends events and answers once they are durable (WAL, ``synchronous=FULL``).

    Every Append queued when a transaction starts shares that transaction
    (see the module docstring); callers still ``ask(Append(drafts=...))`` and
    get their own ``list[StoredEvent]``, or the error that failed them.

    ``fill_wait_s`` bounds how long a batch waits to fill, seconds (None: the
    last commit's duration, capped; 0: never waits; see :mod:`.commit_fill`).

    ``on_event``, when given, is called with each durable event in seq order
    on the observer's own thread; a slow observer never delays an append. Past
    ``observer_capacity`` waiting events the oldest are dropped, counted and
    logged (:meth:`observer_dropped`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        node_id: str,
        on_event: Callable[[StoredEvent], None] | None = None,
        observer_capacity: int = DEFAULT_CAPACITY,
        *,
        checkpoint_every_events: int | None = None,
        checkpoint_every_s: float = DEFAULT_EVERY_S,
        latency: CommitLatency | None = None,
        health: AppendHealth | None = None,
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        origin: str | None = None,
        fill_wait_s: float | None = None,
    ) -> None:
        super().__init__()
        self._fill = FillPolicy(fill_wait_s)
        self._queued = 0  # appends waiting when the last transaction committed
        self._on_checkpoint = on_checkpoint
        self._origin = origin
        self._latency = latency
        self._health = health
        self._checkpoint_every = (checkpoint_every_events, checkpoint_every_s)
        self._checkpointer: Checkpointer | None = None
        self._path = path
        self._node_id = node_id
        self._on_event = on_event
        self._observer_capacity = observer_capacity
        self._observer: EventObserver | None = None
        self._chain: SqliteChain | None = None

    def on_start(self) -> None:
        self._chain = SqliteChain.open(self._path, self._node_id)
        every_events, every_s = self._checkpoint_every
        if every_events is not None:
            folder = os.path.dirname(os.fspath(self._path))
            signer = load_or_create_signer(folder, self._node_id, origin=self._origin)
            self._checkpointer = Checkpointer(
                self._path, self._node_id, signer, every_events=every_events, every_s=every_s
            )
        if self._on_event is not None:
            self._observer = EventObserver(self._on_event, self._observer_capacity)

    def on_stop(self) -> None:
        if self._checkpointer is not None:
            try:
                signed = self._checkpointer.close()
            except ChainError:
                log.exception("the last checkpoint could not be written")
            else:
                # Handed on as every other: the witnesses' flush at a clean stop
                # submits it (a newcomer's trial, stop 34: it was signed and
                # stored but never offered, so a backup of the session's start
                # restored over its end booted unwitnessed).
                if signed is not None and self._on_checkpoint is not None:
                    self._on_checkpoint(signed)
        if self._chain is not None:
            self._chain.close()
        if self._observer is not None:
            self._observer.close()

    def observer_dropped(self) -> int:
        """Events the observer dropped because it fell behind (0 without one)."""
        return 0 if self._observer is None else self._observer.dropped

    @staticmethod
    def _create_actor_inbox() -> WriterInbox:  # pykka's hook for an actor's inbox
        return WriterInbox()

    @staticmethod
    def _create_future() -> Latch[Any]:  # pykka's hook: what ``ask`` answers through
        return Latch()

    def on_receive(self, message: Any) -> list[StoredEvent]:
        if not isinstance(message, Append):
            raise TypeError(f"ChainWriter takes Append, not {type(message).__name__}")
        group = [_Ask(list(message.drafts), None)]
        other = self._gather(group)
        if other is None:
            wait = self._fill.next
            self._inbox.wait_for_appends(wait.asks - len(group), wait.at_most_s)
            other = self._gather(group)
        try:
            return self._commit_filling(group)
        finally:
            if other is not None:
                self._handle_other(other)

    def _commit_filling(self, group: list[_Ask]) -> list[StoredEvent]:
        """:meth:`_commit`, then the next batch's fill from how it went (:mod:`.commit_fill`)."""
        started = time.perf_counter()
        try:
            answer = self._commit(group)
        except Exception:
            self._fill.failed()
            raise
        self._fill.committed(len(group), self._queued, time.perf_counter() - started)
        return answer

    @property
    def _inbox(self) -> WriterInbox:
        return cast("WriterInbox", self.actor_inbox)

    def _gather(self, group: list[_Ask]) -> Any | None:
        """Add every Append queued now to ``group``; stops at (and returns) any other envelope."""
        appends, other = self._inbox.take_appends()
        group += [_Ask(list(e.message.drafts), e.reply_to) for e in appends]
        return other

    def _commit(self, group: list[_Ask]) -> list[StoredEvent]:
        """Store the group in one transaction and answer each ask; returns the first's events.

        Raises:
            The first ask's own error (invalid drafts) or the transaction's.
        """
        # The chain checks every draft before its transaction, so the common case
        # checks each once; only a group holding an invalid draft is sorted out.
        first_error: Exception | None = None
        valid = group
        try:
            stored = self._append(valid, invalid_alone=True)
        except InvalidEventError:
            valid, first_error = _without_invalid(group)
            stored = self._append(valid, invalid_alone=False)
        # Counted before any ask is answered: an answered caller that appends
        # again at once is one of the group, not another caller.
        self._queued = self._inbox.appends_waiting()
        first: list[StoredEvent] = []
        answers: list[tuple[pykka.Future[Any], list[StoredEvent]]] = []
        start = 0
        for ask in valid:
            mine = stored[start : start + len(ask.drafts)]
            start += len(ask.drafts)
            if ask.reply_to is None:
                first = mine
            else:
                answers.append((ask.reply_to, mine))
        answer_in_turn(answers)  # one wake-up here; each caller wakes the next
        if self._observer is not None:
            self._observer.offer(stored)
        self._checkpoint(stored)
        if first_error is not None:
            raise first_error
        return first

    def _checkpoint(self, stored: list[StoredEvent]) -> None:
        """Sign a checkpoint when one is due; hand it on (a failure is logged only)."""
        if self._checkpointer is None or not stored:
            return
        try:
            signed = self._checkpointer.observe(stored)
        except ChainError:
            log.exception("a checkpoint could not be written; the events are stored")
            return
        if signed is not None and self._on_checkpoint is not None:
            self._on_checkpoint(signed)  # a tell per witness: never waits

    def _append(self, valid: list[_Ask], *, invalid_alone: bool) -> list[StoredEvent]:
        """One transaction for the drafts of ``valid``; if it fails, fail them all, re-raise.

        With ``invalid_alone``, an invalid draft (refused before any transaction:
        nothing stored) fails nobody here: the caller fails its ask alone.
        """
        assert self._chain is not None
        drafts = [draft for ask in valid for draft in ask.drafts]
        started = time.perf_counter()
        try:
            stored = self._chain.append_many(drafts)
        except Exception as exc:
            if invalid_alone and isinstance(exc, InvalidEventError):
                raise  # refused before its transaction, nothing stored: see _commit
            # One transaction: none of the group is stored, so every asker fails.
            if self._health is not None and drafts:
                self._health.failed(exc)
            for ask in valid:
                if ask.reply_to is not None:
                    _fail(ask)
            raise
        if self._health is not None and drafts:
            self._health.succeeded()
        if self._latency is not None and drafts:
            self._latency.observe(time.perf_counter() - started)
        return stored

    def _handle_other(self, envelope: Any) -> None:
        """Handle a non-Append envelope met while gathering, as pykka's loop would."""
        try:
            response = self._handle_receive(envelope.message)
        except Exception:
            if envelope.reply_to is None:
                log.exception("chain writer failed on %r", envelope.message)
            else:
                envelope.reply_to.set_exception()
            return
        if envelope.reply_to is not None:
            envelope.reply_to.set(response)


def _without_invalid(group: list[_Ask]) -> tuple[list[_Ask], Exception | None]:
    """The asks of ``group`` whose drafts are all valid. Every other ask is failed
    with its own error, but the first's (``reply_to`` None), which is returned."""
    first_error: Exception | None = None
    valid: list[_Ask] = []
    for ask in group:
        try:
            check_drafts(ask.drafts)
        except InvalidEventError as exc:
            if ask.reply_to is None:
                first_error = exc
            else:
                _fail(ask)
            continue
        valid.append(ask)
    return valid, first_error


def _fail(ask: _Ask) -> None:
    """Fail a drained ask with the exception being handled. Logged at debug level
    only: the asker gets the error, and a refused write is logged once per kind
    of error by :class:`~.append_health.AppendHealth`, not once per retry."""
    log.debug("append of %d drafts failed", len(ask.drafts), exc_info=True)
    if ask.reply_to is not None:
        ask.reply_to.set_exception()
