"""Clocks: time is injected into every actor.

Durations use the monotonic clock; wall time (ns since the epoch, UTC) is for
event timestamps only. :class:`ManualClock` lets a test advance time and fire
timers deterministically; :class:`RealClock` runs timers on one scheduler thread.

A callback that raises is logged with its timer and handed to the clock's
``on_error`` hook (when set); it never stops the other timers: not the
scheduler thread, nor a :meth:`ManualClock.advance` in progress.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "ErrorHook", "ManualClock", "RealClock", "Timer"]

log = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; :meth:`cancel` keeps it from running (idempotent).

    ``fired`` turns true just before the clock calls ``fn`` (a watchdog reads it
    to tell a timer that is late from one whose callback is slow); ``fired_at``
    is the clock's monotonic time then (later than ``due`` by as long as the
    clock's thread did not run: a pause, or a starved thread).
    """

    __slots__ = ("cancelled", "due", "fired", "fired_at", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False
        self.fired = False
        self.fired_at: float | None = None

    def cancel(self) -> None:
        """Do not run (a no-op once it has run)."""
        self.cancelled = True

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"<Timer {name} due {self.due:.3f}>"


#: Told of a callback that raised: the timer and the exception (on the clock's
#: thread, after it is logged). It must be quick and must not raise.
ErrorHook = Callable[[Timer, Exception], None]


class Clock(Protocol):
    """What actors need of time.

    Attributes:
        on_error: told of every timer callback that raised (None: only logged).
    """

    on_error: ErrorHook | None

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations)."""
        ...

    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch, UTC (for event timestamps)."""
        ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` after ``delay`` seconds. ``fn`` must not block (tell, don't ask)."""
        ...


class _Schedule:
    """A heap of timers ordered by due time, then by scheduling order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()

    def push(self, timer: Timer) -> None:
        heapq.heappush(self._heap, (timer.due, next(self._order), timer))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Timer | None:
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[2]
        return None


def _fire(timer: Timer, now: float) -> Exception | None:
    """Run one timer's callback at ``now``; what it raises is logged and returned."""
    timer.fired_at = now
    timer.fired = True
    try:
        timer.fn()
    except Exception as e:
        log.exception("clock: timer callback %r raised; the other timers go on", timer)
        return e
    return None


def _tell(on_error: ErrorHook | None, timer: Timer, error: Exception) -> None:
    """Hand a callback's error to the hook; the hook's own errors are only logged."""
    if on_error is None:
        return
    try:
        on_error(timer, error)
    except Exception:
        log.exception("clock: the on_error hook raised on %r", timer)


class RealClock:
    """The system clocks, with timers run on one daemon scheduler thread."""

    def __init__(self, on_error: ErrorHook | None = None) -> None:
        self.on_error = on_error
        self._schedule = _Schedule()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return time.time_ns()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(delay, 0.0), fn)
        with self._cond:
            self._schedule.push(timer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="clock", daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def _run(self) -> None:
        while True:
            with self._cond:
                timer = self._schedule.pop_due(time.monotonic())
                if timer is None:
                    due = self._schedule.next_due()
                    self._cond.wait(None if due is None else max(due - time.monotonic(), 0))
                    continue
            if not timer.cancelled and (error := _fire(timer, time.monotonic())) is not None:
                _tell(self.on_error, timer, error)


class ManualClock:
    """A clock that moves only when the test calls :meth:`advance`.

    Timers fire in due order, on the caller's thread, with the clock set to
    each timer's due time as it fires. A callback that raises is logged,
    told to ``on_error`` and kept in :attr:`errors`; the others still fire.
    """

    def __init__(
        self, start_wall_ns: int = 1_800_000_000 * 10**9, on_error: ErrorHook | None = None
    ) -> None:
        self.on_error = on_error
        #: Every callback that raised, with its timer, in the order they fired.
        self.errors: list[tuple[Timer, Exception]] = []
        self._now = 0.0
        self._wall0 = start_wall_ns
        self._schedule = _Schedule()
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def wall_ns(self) -> int:
        with self._lock:
            return self._wall0 + int(self._now * 1e9)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        with self._lock:
            timer = Timer(self._now + max(delay, 0.0), fn)
            self._schedule.push(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due."""
        with self._lock:
            end = self._now + seconds
        while True:
            with self._lock:
                timer = self._schedule.pop_due(end)
                if timer is None:
                    self._now = end
                    return
                self._now = now = max(self._now, timer.due)
            if not timer.cancelled and (error := _fire(timer, now)) is not None:
                with self._lock:
                    self.errors.append((timer, error))
                _tell(self.on_error, timer, error)

    def jump(self, seconds: float) -> None:
        """Move time forward by ``seconds`` firing nothing, as across a pause of the
        process (SIGSTOP, a frozen cgroup): the next :meth:`advance` fires the
        timers that fell due meanwhile, late, at the time it reaches."""
        with self._lock:
            self._now += seconds

    def pending(self) -> list[float]:
        """Due times (monotonic seconds) of timers not yet fired, cancelled ones included."""
        with self._lock:
            return sorted(t[0] for t in self._schedule._heap)
