"""Group commit that fills its batches (actors/commit_fill.py in the chain writer).

What shares a transaction is counted by wrapping ``SqliteChain.append_many``;
no test asserts a duration. The fill's bound is given generously where a test
needs to know what fills: the writer then waits for the callers it expects,
and every caller does come back. (With the default bound, the last commit's
duration, how full a batch gets depends on how fast the callers come back: that
is measured in bench/summary.py, not asserted here.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pykka
import pytest
from chain_writers import AppendMany, Wrap, draft

from infervisor.actors import messages as m
from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.commit_fill import MAX_FILL_WAIT_S, FillPolicy, FillWait, WriterInbox
from infervisor.chain import (
    ChainIOError,
    EventDraft,
    SqliteChain,
    StoredEvent,
    verify_chain,
)

TIMEOUT_S = 30.0
pytest_plugins = ("chain_writer_fixtures",)  # the fixtures start_writer, patch_append_many


class Batches:
    """Records each transaction's subjects; holds the first one until released."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.poison: Callable[[list[str]], bool] = lambda _subjects: False

    def wrap(self, original: AppendMany) -> AppendMany:
        def append_many(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
            subjects = [d.subject for d in drafts]
            self.seen.append(subjects)
            if len(self.seen) == 1:
                self.entered.set()
                assert self.release.wait(TIMEOUT_S), "the first transaction was never released"
            if self.poison(subjects):
                raise ChainIOError("injected: the disk refused the batch")
            return original(chain, drafts)

        return append_many


@pytest.fixture
def batches(patch_append_many: Callable[[Wrap], None]) -> Batches:
    b = Batches()
    patch_append_many(b.wrap)
    return b


class Callers:
    """Appender threads, each appending its events one after the other and
    waiting for each acknowledgement (or error) before the next."""

    def __init__(self, writer: pykka.ActorRef[ChainWriter]) -> None:
        self.writer = writer
        self.answers: dict[int, list[StoredEvent | Exception]] = {}
        self.threads: list[threading.Thread] = []

    def start(self, c: int, rounds: int) -> None:
        self.answers[c] = []
        thread = threading.Thread(target=self._run, args=(c, rounds))
        self.threads.append(thread)
        thread.start()

    def _run(self, c: int, rounds: int) -> None:
        for r in range(rounds):
            try:
                ask = m.Append(drafts=(draft(f"c{c}", r),))
                (event,) = self.writer.ask(ask, timeout=TIMEOUT_S)
            except ChainIOError as exc:
                self.answers[c].append(exc)
            else:
                self.answers[c].append(event)

    def join(self) -> None:
        for t in self.threads:
            t.join(TIMEOUT_S * 2)
            assert not t.is_alive(), "an appender never got its answer"


def in_step(
    start_writer: Callable[..., pykka.ActorRef[ChainWriter]],
    batches: Batches,
    callers: int,
    rounds: int,
) -> Callers:
    """``callers`` appenders brought in step: caller 0's first append is held
    inside the first transaction while every other caller's first append
    queues behind it; caller 0 appends once more than the others, so that all
    of them end in the same batch. The fill's bound is generous: every caller
    the writer expects does come back."""
    writer = start_writer(fill_wait_s=TIMEOUT_S)
    group = Callers(writer)
    group.start(0, rounds + 1)
    assert batches.entered.wait(TIMEOUT_S)
    for c in range(1, callers):
        group.start(c, rounds)
    _wait_queued(writer, callers - 1)
    batches.release.set()
    group.join()
    return group


def test_every_batch_covers_all_callers_once_they_are_in_step(
    start_writer, batches, tmp_path
) -> None:
    callers, rounds = 24, 6
    group = in_step(start_writer, batches, callers, rounds)
    assert [len(b) for b in batches.seen] == [1] + [callers] * rounds
    for c, events in group.answers.items():
        assert all(isinstance(e, StoredEvent) and e.subject == f"c{c}" for e in events)
        assert [e.seq for e in events] == sorted(e.seq for e in events)  # type: ignore[union-attr]
    group.writer.stop(timeout=TIMEOUT_S)
    report = verify_chain(tmp_path / "chain.db")
    assert (report.ok, report.head_seq) == (True, callers * rounds + 1)


def test_a_filled_batch_that_fails_fails_every_caller_and_stores_none(
    start_writer, batches, tmp_path
) -> None:
    callers, rounds = 12, 2
    # The last batch, filled with every caller's last append, fails at its commit.
    batches.poison = lambda subjects: len(batches.seen) == 3
    group = in_step(start_writer, batches, callers, rounds)
    assert [len(b) for b in batches.seen] == [1, callers, callers]
    for events in group.answers.values():
        assert isinstance(events[-1], ChainIOError)
        assert all(isinstance(e, StoredEvent) for e in events[:-1])
    group.writer.stop(timeout=TIMEOUT_S)
    chain = SqliteChain.open_readonly(tmp_path / "chain.db")
    try:
        stored = [e.subject for e in chain.events(after=0)]
    finally:
        chain.close()
    assert stored == batches.seen[0] + batches.seen[1]  # the failed batch: none of it
    assert verify_chain(tmp_path / "chain.db").ok


def _wait_queued(writer: pykka.ActorRef[ChainWriter], count: int) -> None:
    """Wait until ``count`` appends are queued in the (held) writer's inbox."""
    inbox = writer.actor_inbox
    assert isinstance(inbox, WriterInbox)
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.005):
            if inbox.appends_waiting() >= count:
                done.set()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert done.wait(TIMEOUT_S), f"{inbox.appends_waiting()} of {count} appends queued"
    finally:
        done.set()
        poller.join()


# ------------------------------------------------------------- the rule, as a table
@pytest.mark.parametrize(
    ("fill_wait_s", "outcome", "expected"),
    [
        (None, None, FillWait(1, 0.0)),  # no commit yet: commit at once
        (None, (32, 0, 0.002), FillWait(32, 0.002)),  # the callers it covered
        (None, (27, 5, 0.003), FillWait(32, 0.003)),  # ... and those already queued
        (None, (4, 0, 2.5), FillWait(4, MAX_FILL_WAIT_S)),  # a slow commit: capped
        (0.5, (8, 1, 0.001), FillWait(9, 0.5)),  # a fixed bound
        (0.0, (8, 1, 0.001), FillWait(9, 0.0)),  # never waits
        (None, "failed", FillWait(1, 0.0)),  # after a failure: commit at once
    ],
)
def test_the_fill_rule(fill_wait_s: float | None, outcome: Any, expected: FillWait) -> None:
    policy = FillPolicy(fill_wait_s)
    if outcome == "failed":
        policy.committed(32, 0, 0.002)
        policy.failed()
    elif outcome is not None:
        policy.committed(*outcome)
    assert policy.next == expected


def test_a_negative_fill_wait_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="fill_wait_s must be >= 0"):
        FillPolicy(-1.0)


# ------------------------------------------------------------- the inbox
class _Envelope:
    def __init__(self, message: Any) -> None:
        self.message = message


def test_the_inbox_wakes_a_reader_waiting_for_appends_only_once_they_all_wait() -> None:
    inbox = WriterInbox()
    notified: list[int] = []
    notify = inbox.not_empty.notify

    def counting(n: int = 1) -> None:
        notified.append(inbox._appends)  # put holds the lock
        notify(n)

    inbox.not_empty.notify = counting  # type: ignore[method-assign]
    returned = threading.Event()
    reader = threading.Thread(target=lambda: (inbox.wait_for_appends(3, TIMEOUT_S), returned.set()))
    reader.start()
    _until(lambda: inbox._want == 3)
    for n in range(3):
        inbox.put(_Envelope(m.Append(drafts=(draft("x", n),))))
    assert returned.wait(TIMEOUT_S)
    reader.join(TIMEOUT_S)
    assert notified == [3]  # the first two appends woke nobody
    assert inbox.appends_waiting() == 3
    assert [inbox.get_nowait().message.drafts[0].ts_ns % 10 for _ in range(3)] == [0, 1, 2]
    assert inbox.appends_waiting() == 0


def test_any_other_message_wakes_a_reader_waiting_for_appends() -> None:
    inbox = WriterInbox()
    returned = threading.Event()
    reader = threading.Thread(target=lambda: (inbox.wait_for_appends(5, TIMEOUT_S), returned.set()))
    reader.start()
    _until(lambda: inbox._want == 5)
    inbox.put(_Envelope(m.Append(drafts=(draft("x"),))))
    inbox.put(_Envelope("stop"))
    assert returned.wait(TIMEOUT_S)
    reader.join(TIMEOUT_S)
    assert inbox.appends_waiting() == 1
    assert inbox.qsize() == 2


def test_a_reader_not_waiting_is_woken_by_every_put() -> None:
    inbox = WriterInbox()
    inbox.wait_for_appends(3, 0.0)  # no wait: returns at once
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(inbox.get(timeout=TIMEOUT_S)))
    reader.start()
    envelope = _Envelope(m.Append(drafts=(draft("x"),)))
    inbox.put(envelope)
    reader.join(TIMEOUT_S)
    assert got == [envelope]


def _until(condition: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(int(TIMEOUT_S / 0.005)):
        if condition():
            return
        done.wait(0.005)
    raise AssertionError("condition never held")
