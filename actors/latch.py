"""The chain writer's answer to one append: a pykka Future waited on by one lock,
and the waking of a whole group commit's callers one after another.

pykka's ``ThreadingFuture`` waits on a ``threading.Condition``: each answer
builds the condition (an ``RLock``), and each wait allocates a lock, queues it,
and re-takes the condition's lock once woken, all in Python. :class:`Latch` is
the same contract on one ``threading.Lock``, taken when the future is made and
released once answered: waiting is one ``acquire`` (GIL released), answering
one ``release``.

**Waking in turn.** A group commit answers up to one caller per thread; woken
all at once, 32 callers fight for the GIL while the writer still holds it
(forced switches, a thread preempted holding it), and the writer pays every
wake-up. :func:`answer_in_turn` sets every answer first, then wakes only the
first caller that waits; each woken caller wakes the next before it returns
(bench/README.md, "Group commit": 1.8x the rate of waking them all, tmpfs,
same runs). The turn never stops at a caller that is not waiting: a future not
(yet) waited on is released and passed over, and a waiter whose timeout runs
out just as its turn came passes the turn on itself. Every decision about a
turn is taken under one lock (``_TURNS``), so each latch is released exactly
once and every answered caller is woken.

The contract is pykka's (``pykka.Future``): ``get(timeout=)`` blocks until
answered (:class:`pykka.Timeout` past ``timeout`` seconds), returns the value
or raises the exception set, and may be called again (by any thread) with
the same result; a second ``set``/``set_exception`` raises ``queue.Full``.
``map``, ``filter``, ``join``, ``reduce`` and ``pykka.get_all`` work through the
base class's get hook. Each latch is answered by one thread (the writer, or
``ask`` itself when the writer is gone).
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

import pykka

__all__ = ["Latch", "answer_in_turn"]

T = TypeVar("T")

_TURNS = threading.Lock()
"""Guards who is woken next: ``_Turns.next``, ``Latch._waiting``, ``Latch._released``."""


class Latch(pykka.Future[T]):
    """A future whose waiters block on one lock until its answer releases it."""

    def __init__(self) -> None:
        super().__init__()
        self._answered = threading.Lock()
        self._answered.acquire()  # released once, by the answer or by its turn
        self._value: Any = None
        self._exc_info: Any = None
        self._done = False  # the answer is set (it may not be released yet)
        self._turns: _Turns | None = None  # the group it is woken with, if any
        self._waiting = False  # a thread blocks in get() (turns stop at it)
        self._released = False

    def get(self, *, timeout: float | None = None) -> T:
        """The value set, or raise the exception set; waits up to ``timeout`` seconds.

        Raises:
            pykka.Timeout: not answered within ``timeout`` seconds.
            The exception set by :meth:`set_exception`.
        """
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if not self._done:
            self._wait(timeout)
        if self._exc_info is not None:
            _, exc, traceback = self._exc_info
            raise exc.with_traceback(traceback)
        return self._value  # type: ignore[no-any-return]

    def set(self, value: T | None = None) -> None:
        """Answer ``value`` and wake the waiters.

        Raises:
            queue.Full: already answered (or given a get hook).
        """
        self._answer(value, None)
        self._release()

    def set_exception(self, exc_info: Any = None) -> None:
        """Answer an exception (default: the one being handled) and wake the waiters.

        Raises:
            queue.Full: already answered (or given a get hook).
        """
        info: Any = sys.exc_info() if exc_info is None else exc_info
        exc_type, exc, traceback = info
        if exc is None:  # pykka allows (type, None, None)
            exc = exc_type()
        self._answer(None, (exc_type, exc, traceback))
        self._release()

    def _answer(self, value: Any, exc_info: Any) -> None:
        if self._done or self._get_hook is not None:
            raise queue.Full
        self._value, self._exc_info = value, exc_info
        self._done = True

    def _release(self) -> None:
        with _TURNS:
            self._released = True
        self._answered.release()

    def _wait(self, timeout: float | None) -> None:
        """Block until released; then pass the turn on (see the module docstring)."""
        self._waiting = True
        if not self._answered.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            with _TURNS:
                self._waiting = False  # a turn passes over it from now on
                released = self._released
            if not released:
                raise pykka.Timeout(f"{timeout} seconds")
            self._answered.acquire()  # released as the wait ran out: it is answered
        self._answered.release()  # every later or concurrent get passes too
        if self._turns is not None:
            self._turns.wake_next()


class _Turns:
    """The latches of one group commit, woken in order, each by the one before."""

    def __init__(self, latches: list[Latch[Any]]) -> None:
        self.latches = latches
        self._next = 0

    def wake_next(self) -> None:
        """Release the next latches, up to and including the first one waited on."""
        with _TURNS:
            while self._next < len(self.latches):
                latch = self.latches[self._next]
                self._next += 1
                latch._released = True
                latch._answered.release()
                if latch._waiting:
                    return  # its waiter wakes the next


def answer_in_turn(answers: Sequence[tuple[pykka.Future[Any], Any]]) -> None:
    """Set each future's value, then wake their waiters in turn (module docstring).

    A future that is not a :class:`Latch` is simply set.

    Raises:
        queue.Full: a future was already answered (the ones before it are
            set and woken).
    """
    turns = _Turns([])
    try:
        for future, value in answers:
            if isinstance(future, Latch):
                future._answer(value, None)
                future._turns = turns
                turns.latches.append(future)  # nothing is released before all are set
            else:
                future.set(value)
    finally:
        turns.wake_next()  # the ones set are woken even if one could not be
