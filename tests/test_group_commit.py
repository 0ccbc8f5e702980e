"""Group commit in the chain writer, and its observer off the critical path.

No test sleeps to synchronise: the writer is held inside a transaction by a
gate (an Event) while asks queue up, so what shares a transaction is known.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pykka
import pytest
from chain_writers import AppendMany, Wrap, draft

from infervisor.actors import messages as m
from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.observer import EventObserver
from infervisor.chain import (
    ChainIOError,
    EventDraft,
    InvalidEventError,
    SqliteChain,
    StoredEvent,
    encode_payload,
    verify_chain,
)

TIMEOUT_S = 30.0
pytest_plugins = ("chain_writer_fixtures",)  # the fixtures start_writer, patch_append_many


class Gate:
    """Holds the writer inside its next ``append_many`` until released; records batches."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.armed = True
        self.batches: list[list[str]] = []

    def wrap(self, original: AppendMany) -> AppendMany:
        def append_many(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
            self.batches.append([d.subject for d in drafts])
            if self.armed:
                self.armed = False
                self.entered.set()
                assert self.release.wait(TIMEOUT_S), "gate never released"
            return original(chain, drafts)

        return append_many


@pytest.fixture
def gate(patch_append_many: Callable[[Wrap], None]) -> Gate:
    g = Gate()
    patch_append_many(g.wrap)
    return g


def hold(writer: pykka.ActorRef[ChainWriter], gate: Gate) -> pykka.Future[Any]:
    """Send one append and wait until the writer is inside its transaction."""
    future = writer.ask(m.Append(drafts=(draft(subject="gate"),)), block=False)
    assert gate.entered.wait(TIMEOUT_S)
    return future


def stored_subjects(path: Path) -> list[str]:
    chain = SqliteChain.open_readonly(path)
    try:
        return [e.subject for e in chain.events(after=0)]
    finally:
        chain.close()


def test_concurrent_askers_each_get_their_own_durable_events(start_writer, tmp_path) -> None:
    writer = start_writer()
    threads, per_thread = 32, 5
    barrier = threading.Barrier(threads)
    answers: dict[int, list[StoredEvent]] = {}

    def asker(t: int) -> None:
        drafts = tuple(draft(subject=f"t{t}", n=i) for i in range(per_thread))
        barrier.wait(TIMEOUT_S)
        answers[t] = writer.ask(m.Append(drafts=drafts), timeout=TIMEOUT_S)

    workers = [threading.Thread(target=asker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(TIMEOUT_S)
    assert sorted(answers) == list(range(threads))
    for t, events in answers.items():
        assert [(e.subject, e.payload) for e in events] == [
            (f"t{t}", encode_payload({"n": i})) for i in range(per_thread)
        ]
        seqs = [e.seq for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + per_thread))
    all_seqs = sorted(e.seq for events in answers.values() for e in events)
    assert all_seqs == list(range(1, threads * per_thread + 1))
    writer.stop(timeout=TIMEOUT_S)
    report = verify_chain(tmp_path / "chain.db")
    assert report.ok
    assert report.head_seq == threads * per_thread
    chain = SqliteChain.open_readonly(tmp_path / "chain.db")
    try:
        by_seq = {e.seq: e for e in chain.events()}
    finally:
        chain.close()
    for events in answers.values():
        for e in events:
            assert by_seq[e.seq] == e  # the acknowledged seq and hash are the stored ones


def test_everything_queued_shares_one_transaction(start_writer, gate, tmp_path) -> None:
    writer = start_writer()
    first = hold(writer, gate)
    futures = [
        writer.ask(m.Append(drafts=(draft(subject=f"a{i}"), draft(subject=f"b{i}"))), block=False)
        for i in range(20)
    ]
    gate.release.set()
    assert [e.subject for e in first.get(timeout=TIMEOUT_S)] == ["gate"]
    for i, future in enumerate(futures):
        assert [e.subject for e in future.get(timeout=TIMEOUT_S)] == [f"a{i}", f"b{i}"]
    assert len(gate.batches) == 2  # the gate's, then all 20 asks in one
    assert gate.batches[1] == [s for i in range(20) for s in (f"a{i}", f"b{i}")]
    writer.stop(timeout=TIMEOUT_S)
    assert verify_chain(tmp_path / "chain.db").ok


def test_callers_woken_in_turn_all_wake_whoever_does_not_wait(start_writer, gate) -> None:
    """One transaction answers callers blocked in ``get``, asks nobody waits on yet
    (``block=False``) and a caller that gave up waiting: the turn that wakes them
    one after another (actors/latch.py) passes over those not waiting, so every
    blocked caller wakes, and the others read their answer later."""
    writer = start_writer()
    first = hold(writer, gate)
    got: dict[int, list[str]] = {}
    futures = [
        writer.ask(m.Append(drafts=(draft(subject=f"s{i}"),)), block=False) for i in range(12)
    ]

    def wait_for(i: int) -> None:
        got[i] = [e.subject for e in futures[i].get(timeout=TIMEOUT_S)]

    waiting = [i for i in range(12) if i % 3 == 0]
    threads = [threading.Thread(target=wait_for, args=(i,)) for i in waiting]
    for t in threads:
        t.start()
    with pytest.raises(pykka.Timeout):
        futures[1].get(timeout=0)  # gave up before the answer
    for i in waiting:
        until_waiting(futures[i])
    gate.release.set()
    for t in threads:
        t.join(TIMEOUT_S)
    assert got == {i: [f"s{i}"] for i in waiting}
    assert first.get(timeout=TIMEOUT_S)[0].subject == "gate"
    assert [f.get(timeout=0)[0].subject for f in futures] == [f"s{i}" for i in range(12)]
    assert gate.batches[1] == [f"s{i}" for i in range(12)]  # one transaction


def until_waiting(future: pykka.Future[Any]) -> None:
    """Until a thread blocks in ``future.get`` (the latch's flag; generous deadline)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not getattr(future, "_waiting", False):
        assert time.monotonic() < deadline, "the caller never blocked in get"
        time.sleep(0.001)


def test_a_failed_transaction_fails_every_caller_and_stores_none(
    start_writer, gate, tmp_path, monkeypatch
) -> None:
    gated = SqliteChain.append_many

    def poisoned(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        if any(d.kind == "test.poison" for d in drafts):
            gate.batches.append([d.subject for d in drafts])
            raise ChainIOError("injected: the disk refused the batch")
        return gated(chain, drafts)

    monkeypatch.setattr(SqliteChain, "append_many", poisoned)
    writer = start_writer()
    first = hold(writer, gate)
    doomed = [
        writer.ask(m.Append(drafts=(draft(subject="x1"),)), block=False),
        writer.ask(m.Append(drafts=(draft(kind="test.poison", subject="x2"),)), block=False),
        writer.ask(m.Append(drafts=(draft(subject="x3"), draft(subject="x4"))), block=False),
    ]
    gate.release.set()
    first.get(timeout=TIMEOUT_S)
    for future in doomed:
        with pytest.raises(ChainIOError, match="injected"):
            future.get(timeout=TIMEOUT_S)
    assert gate.batches[-1] == ["x1", "x2", "x3", "x4"]
    later = writer.ask(m.Append(drafts=(draft(subject="after"),)), timeout=TIMEOUT_S)
    assert [e.seq for e in later] == [2]
    writer.stop(timeout=TIMEOUT_S)
    assert stored_subjects(tmp_path / "chain.db") == ["gate", "after"]
    assert verify_chain(tmp_path / "chain.db").ok


def test_an_invalid_ask_fails_alone(start_writer, gate, tmp_path) -> None:
    writer = start_writer()
    first = hold(writer, gate)
    good = writer.ask(m.Append(drafts=(draft(subject="ok1"),)), block=False)
    bad = writer.ask(m.Append(drafts=(draft(kind="", subject="bad"),)), block=False)
    good2 = writer.ask(m.Append(drafts=(draft(subject="ok2"),)), block=False)
    gate.release.set()
    first.get(timeout=TIMEOUT_S)
    with pytest.raises(InvalidEventError):
        bad.get(timeout=TIMEOUT_S)
    assert [e.subject for e in good.get(timeout=TIMEOUT_S)] == ["ok1"]
    assert [e.subject for e in good2.get(timeout=TIMEOUT_S)] == ["ok2"]
    writer.stop(timeout=TIMEOUT_S)
    assert stored_subjects(tmp_path / "chain.db") == ["gate", "ok1", "ok2"]


def test_asks_queued_before_stop_are_committed_and_later_ones_refused(start_writer, gate) -> None:
    writer = start_writer()
    first = hold(writer, gate)
    before = [writer.ask(m.Append(drafts=(draft(subject=f"q{i}"),)), block=False) for i in range(3)]
    stopped = writer.stop(block=False)
    after = writer.ask(m.Append(drafts=(draft(subject="late"),)), block=False)
    gate.release.set()
    first.get(timeout=TIMEOUT_S)
    assert [f.get(timeout=TIMEOUT_S)[0].subject for f in before] == ["q0", "q1", "q2"]
    stopped.get(timeout=TIMEOUT_S)
    with pytest.raises(pykka.ActorDeadError):
        after.get(timeout=TIMEOUT_S)


def test_a_stalled_observer_never_blocks_appends(start_writer, tmp_path) -> None:
    entered, release, caught_up = threading.Event(), threading.Event(), threading.Event()
    seen: list[int] = []
    last = 50

    def observer(event: StoredEvent) -> None:
        entered.set()
        assert release.wait(TIMEOUT_S)
        seen.append(event.seq)
        if event.seq == last:
            caught_up.set()

    writer = start_writer(on_event=observer)
    for i in range(last):
        writer.ask(m.Append(drafts=(draft(n=i),)), timeout=TIMEOUT_S)  # never waits on it
    assert entered.wait(TIMEOUT_S)  # the observer holds seq 1 and waits
    assert not seen
    assert writer.proxy().observer_dropped().get(timeout=TIMEOUT_S) == 0
    release.set()
    assert caught_up.wait(TIMEOUT_S)
    assert seen == list(range(1, last + 1))


def test_a_full_observer_drops_the_oldest_and_counts_them(start_writer) -> None:
    entered, release, caught_up = threading.Event(), threading.Event(), threading.Event()
    seen: list[int] = []

    def observer(event: StoredEvent) -> None:
        entered.set()
        assert release.wait(TIMEOUT_S)
        seen.append(event.seq)
        if event.seq == 21:
            caught_up.set()

    writer = start_writer(on_event=observer, observer_capacity=4)
    writer.ask(m.Append(drafts=(draft(),)), timeout=TIMEOUT_S)
    assert entered.wait(TIMEOUT_S)  # seq 1 is in the callback; the buffer is empty
    for i in range(20):
        writer.ask(m.Append(drafts=(draft(n=i),)), timeout=TIMEOUT_S)
    assert writer.proxy().observer_dropped().get(timeout=TIMEOUT_S) == 16
    release.set()
    assert caught_up.wait(TIMEOUT_S)
    assert seen == [1, 18, 19, 20, 21]


def test_observer_errors_are_logged_and_it_carries_on() -> None:
    done = threading.Event()
    seen: list[int] = []

    def flaky(event: StoredEvent) -> None:
        seen.append(event.seq)
        if event.seq == 1:
            raise RuntimeError("injected observer failure")
        done.set()

    observer = EventObserver(flaky, capacity=8)
    chain_events = [_event(1), _event(2)]
    observer.offer(chain_events)
    assert done.wait(TIMEOUT_S)
    observer.close()
    assert seen == [1, 2]


def test_observer_refuses_a_capacity_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EventObserver(lambda _e: None, capacity=0)


def _event(seq: int) -> StoredEvent:
    return StoredEvent(
        seq=seq,
        ts_ns=0,
        node="n",
        source="test",
        kind="test.event",
        subject="",
        payload=b"{}",
        payload_hash=bytes(32),
        prev_hash=bytes(32),
        hash=bytes(32),
    )
