"""The chain writer's futures (actors/latch.py): pykka's Future contract on one
lock, and a group's callers woken in turn, each by the one before.

Threads wait on latches; a test knows a thread blocks in ``get`` by the latch's
``_waiting`` flag (set just before it blocks), polled with a generous deadline.
No sleep synchronises anything.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from typing import Any

import pykka
import pytest

from infervisor.actors.latch import Latch, answer_in_turn

DEADLINE_S = 10.0


def until(condition: Any, what: str) -> None:
    """Poll ``condition()`` until true, at most DEADLINE_S seconds."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.001)


class Waiter:
    """A thread blocked in ``latch.get(timeout=...)``; records what it got."""

    def __init__(self, latch: Latch[Any], timeout: float | None = DEADLINE_S) -> None:
        self.latch = latch
        self.got: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(timeout,))
        self.thread.start()

    def _run(self, timeout: float | None) -> None:
        try:
            self.got.append(self.latch.get(timeout=timeout))
        except (pykka.Timeout, ValueError) as exc:
            self.got.append(exc)

    def blocked(self) -> Waiter:
        until(lambda: self.latch._waiting, "blocked in get")
        return self

    def result(self) -> Any:
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive(), "the waiter was never woken"
        return self.got[0]


def test_set_then_get_returns_the_value_every_time() -> None:
    latch: Latch[int] = Latch()
    latch.set(7)
    assert latch.get() == 7
    assert latch.get(timeout=0) == 7


def test_get_times_out_then_returns_once_answered() -> None:
    latch: Latch[int] = Latch()
    with pytest.raises(pykka.Timeout):
        latch.get(timeout=0)
    waiter = Waiter(latch).blocked()
    latch.set(3)
    assert waiter.result() == 3
    assert latch.get(timeout=0) == 3


def test_a_second_answer_is_refused() -> None:
    latch: Latch[int] = Latch()
    latch.set(1)
    with pytest.raises(queue.Full):
        latch.set(2)
    with pytest.raises(queue.Full):
        latch.set_exception((ValueError, ValueError("late"), None))
    assert latch.get() == 1


def test_an_exception_is_raised_to_every_getter() -> None:
    latch: Latch[int] = Latch()
    waiters = [Waiter(latch).blocked() for _ in range(3)]
    try:
        raise ValueError("disk full")
    except ValueError:
        latch.set_exception()
    for waiter in waiters:
        assert str(waiter.result()) == "disk full"
    with pytest.raises(ValueError, match="disk full"):
        latch.get()


def test_an_exception_type_alone_is_instantiated() -> None:
    latch: Latch[int] = Latch()
    latch.set_exception((pykka.ActorDeadError, None, None))
    with pytest.raises(pykka.ActorDeadError):
        latch.get()


def test_pykka_combinators_work_on_latches() -> None:
    a: Latch[int] = Latch()
    b: Latch[int] = Latch()
    a.set(2)
    b.set(5)
    assert pykka.get_all([a, b]) == [2, 5]
    assert a.map(lambda v: v * 10).get(timeout=DEADLINE_S) == 20
    assert a.join(b).get(timeout=DEADLINE_S) == [2, 5]


def test_answer_in_turn_wakes_every_waiter_with_its_own_value() -> None:
    latches: list[Latch[int]] = [Latch() for _ in range(32)]
    waiters = [Waiter(latch).blocked() for latch in latches]
    answer_in_turn([(latch, i) for i, latch in enumerate(latches)])
    assert [w.result() for w in waiters] == list(range(32))


def test_a_turn_passes_over_futures_nobody_waits_on() -> None:
    """Waited, never waited (an ask with block=False), timed out before the answer,
    waited: every waiter wakes and the others read their answer later."""
    waited_first, never, timed_out, waited_last = (Latch() for _ in range(4))
    first = Waiter(waited_first).blocked()
    with pytest.raises(pykka.Timeout):
        timed_out.get(timeout=0.001)
    last = Waiter(waited_last).blocked()
    answer_in_turn([(waited_first, "a"), (never, "b"), (timed_out, "c"), (waited_last, "d")])
    assert (first.result(), last.result()) == ("a", "d")
    assert (never.get(timeout=0), timed_out.get(timeout=0)) == ("b", "c")


class _RunsOutAsReleased:
    """A latch's lock whose timed wait runs out at the moment its turn releases it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.gave_up = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if timeout >= 0 and not self.gave_up:
            self.gave_up = True
            return False  # the wait ran out ...
        return bool(self.lock.acquire(blocking, timeout))

    def release(self) -> None:
        self.lock.release()


def test_a_waiter_whose_wait_runs_out_as_its_turn_comes_passes_the_turn_on() -> None:
    mine: Latch[str] = Latch()
    behind: Latch[str] = Latch()
    racing = _RunsOutAsReleased(mine._answered)
    mine._answered = racing  # type: ignore[assignment]
    mine._waiting = True  # the turn stops at it: its waiter is to wake the next
    waiter = Waiter(behind).blocked()
    answer_in_turn([(mine, "mine"), (behind, "behind")])
    assert not behind._released  # the turn stopped at mine, whose waiter is to pass it on
    assert mine._wait(timeout=0.0) is None  # ... and the turn had come: passes it on
    assert racing.gave_up
    assert mine.get(timeout=0) == "mine"
    assert waiter.result() == "behind"


def test_turns_wake_every_waiter_whatever_mix_of_callers() -> None:
    """Random groups of waiting, never-waiting and timed-out futures (seeded):
    each waiter wakes with its value; every kind of caller was met."""
    rng = random.Random(22)
    kinds: Counter[str] = Counter()
    for _ in range(40):
        answers: list[tuple[pykka.Future[Any], Any]] = []
        waiters: list[tuple[Waiter, int]] = []
        for i in range(rng.randint(1, 12)):
            latch: Latch[int] = Latch()
            kind = rng.choice(("waits", "never", "timed out"))
            kinds[kind] += 1
            if kind == "waits":
                waiters.append((Waiter(latch).blocked(), i))
            elif kind == "timed out":
                with pytest.raises(pykka.Timeout):
                    latch.get(timeout=0)
            answers.append((latch, i))
        answer_in_turn(answers)
        for waiter, value in waiters:
            assert waiter.result() == value
        assert [f.get(timeout=0) for f, _ in answers] == [v for _, v in answers]
    assert set(kinds) == {"waits", "never", "timed out"}, kinds


def test_an_answer_refused_midway_still_wakes_the_waiters_set_before_it() -> None:
    before: Latch[str] = Latch()
    answered: Latch[str] = Latch()
    answered.set("already")
    waiter = Waiter(before).blocked()
    with pytest.raises(queue.Full):
        answer_in_turn([(before, "mine"), (answered, "again")])
    assert waiter.result() == "mine"
    assert answered.get(timeout=0) == "already"
