"""The watchdog: who supervises the supervisor.

A small daemon thread (not an actor: it must outlive the actors it watches)
checks, every :data:`CHECK_EVERY_S` seconds of real time, that

- the supervisor, host and chain writer actors are still running, and
- the supervisor still ticks: its health timer fires when due (on the
  node's clock) and the supervisor handles each tick it fires (within
  ``stall_s`` real seconds).

The first thing found wrong is the node's :class:`NodeFailure`: logged once,
kept, and seen through :attr:`Watchdog.failure` and
:meth:`Watchdog.wait_failed` (``Node.failure`` and ``Node.wait_failed``). The
node does not carry on as if nothing happened: ``infervisor run`` exits
non-zero naming the cause, and the next run resumes from the chain (managed
servers recorded as running are re-attached).

Time: a late timer is judged on the node's clock (a :class:`ManualClock` that
the test does not advance is never late); a tick fired and not handled is
judged in real time, because a blocked actor does not move the clock either.
The clock's callback errors (its ``on_error`` hook) are kept and named in a
stall's cause, since a raising callback is the likeliest reason for one.

A pause is not a stall. A node stopped with SIGSTOP, in a frozen cgroup or a
paused VM does not run at all, yet CLOCK_MONOTONIC goes on (it stops only
during system suspend): when it continues, every thread wakes at once and
every timer looks late by the pause. A stuck timer thread or a blocked
supervisor leaves the watchdog's own thread running on time; a pause does
not. So each check measures how late its own wake-up was: late by more than
:data:`PAUSE_AFTER_S` (real time), the gap is taken for a pause: logged ("the
node was paused for N s"), and the stall allowance starts again from the
resume. Only lateness that builds up across checks that themselves ran on
time fails the node. (A thread that holds the GIL for long stops the
watchdog too, and is taken for a pause until it lets go: nothing can act
while it holds it anyway.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pykka

from .clock import Clock, Timer

__all__ = ["CHECK_EVERY_S", "PAUSE_AFTER_S", "NodeFailure", "Watchdog", "stall_after"]

log = logging.getLogger(__name__)

#: How often the watchdog looks, real seconds.
CHECK_EVERY_S = 0.5
#: A tick late or unhandled for this many health intervals (at least
#: :data:`MIN_STALL_S` seconds) means the supervisor has stopped.
STALL_TICKS = 10
MIN_STALL_S = 15.0
#: A check that wakes this many real seconds later than :data:`CHECK_EVERY_S`
#: after the previous one means the process did not run meanwhile (a pause).
#: Well below :data:`MIN_STALL_S`, and well above a starved thread's usual delay.
PAUSE_AFTER_S = 3.0


def stall_after(tick_s: float) -> float:
    """Seconds without a tick after which the supervisor counts as stopped."""
    return max(STALL_TICKS * tick_s, MIN_STALL_S)


@dataclass(frozen=True)
class NodeFailure:
    """Why the node stopped working: ``what`` failed (``"supervisor actor"``,
    ``"host actor"``, ``"chain writer actor"`` or ``"supervision ticks"``) and
    the ``cause``, in words for an operator."""

    what: str
    cause: str

    def __str__(self) -> str:
        return f"{self.what}: {self.cause}"


class Watchdog:
    """Watches the node-wide actors and the supervisor's health ticks.

    Thread-safe: the supervisor calls :meth:`watch_tick` and
    :meth:`actor_failed` from its thread, the clock calls :meth:`clock_error`
    from its thread, and anyone may read :attr:`failure`.

    Args:
        clock: the node's clock (a late tick is judged on it).
        stall_s: seconds a tick may be late (clock) or unhandled (real time).
        real_time: the real monotonic clock (injected by tests).
    """

    def __init__(
        self,
        clock: Clock,
        stall_s: float,
        real_time: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._stall_s = stall_s
        self._real_time = real_time
        self._lock = threading.Lock()
        self._failed = threading.Event()
        self._stopped = threading.Event()
        self._failure: NodeFailure | None = None
        self._actors: dict[str, pykka.ActorRef[Any]] = {}
        self._causes: dict[str, str] = {}
        self._tick: Timer | None = None
        self._tick_seen_fired: float | None = None
        self._clock_error: str | None = None
        self._thread: threading.Thread | None = None
        #: Real time of the last check (None before the first).
        self._last_check: float | None = None
        #: Node clock at the last resume from a pause: lateness counts from there.
        self._resumed_at: float | None = None
        #: Pauses seen, and their total length, real seconds.
        self.pauses = 0
        self.paused_s = 0.0
        self._on_tick: list[Callable[[], object]] = []

    # ------------------------------------------------------------------ the node
    def start(self, actors: Mapping[str, pykka.ActorRef[Any]]) -> None:
        """Watch ``actors`` (name -> ref) from a daemon thread, until :meth:`stop`."""
        with self._lock:
            self._actors = dict(actors)
            self._last_check = self._real_time()  # a pause before the first check is one too
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the watched actors are stopped on purpose). Idempotent."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def failure(self) -> NodeFailure | None:
        """The node's failure, or None while everything is running."""
        with self._lock:
            return self._failure

    def wait_failed(self, timeout_s: float | None = None) -> NodeFailure | None:
        """Block until the node fails (its failure) or ``timeout_s`` passes (None)."""
        self._failed.wait(timeout_s)
        return self.failure

    def on_tick(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` on the supervisor's thread each time it arms a health
        tick while the node has not failed: a sign of life that stops when the
        supervisor does (systemd's ``WATCHDOG=1``). Keep it quick and non-blocking;
        what it raises is logged."""
        with self._lock:
            self._on_tick.append(callback)

    # ------------------------------------------------------------------ reporters
    def watch_tick(self, timer: Timer) -> None:
        """The supervisor armed its next health tick (it handled the previous one)."""
        with self._lock:
            self._tick = timer
            self._tick_seen_fired = None
            alive = [] if self._failure is not None else list(self._on_tick)
        for callback in alive:
            try:
                callback()
            except Exception:
                log.exception("a tick callback failed")

    def actor_failed(self, name: str, error: BaseException) -> None:
        """An actor is ending on an unhandled error: named in its failure's cause."""
        with self._lock:
            self._causes[name] = f"{type(error).__name__}: {error}"

    def clock_error(self, timer: Timer, error: Exception) -> None:
        """The clock's ``on_error`` hook: the last callback error, for a stall's cause."""
        with self._lock:
            self._clock_error = f"{timer!r} raised {type(error).__name__}: {error}"

    def fail(self, what: str, cause: str) -> None:
        """Declare the node failed (the first failure is kept; later ones are logged)."""
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = NodeFailure(what, cause)
        if first:
            log.error("node failed: %s: %s", what, cause)
            self._failed.set()
        else:
            log.error("also failed: %s: %s", what, cause)

    # ------------------------------------------------------------------ checks
    def check(self) -> NodeFailure | None:
        """Look once (the thread does this every :data:`CHECK_EVERY_S`); the failure.

        Both clocks are read first, once: a pause that begins later in this
        check makes no lateness in it, and the next check sees the gap.
        """
        now, real_now = self._clock.monotonic(), self._real_time()
        if self.failure is None:
            self._note_pause(now, real_now)
            found = self._dead_actor() or self._stalled_tick(now, real_now)
            if found is not None:
                self.fail(*found)
        return self.failure

    def _note_pause(self, now: float, real_now: float) -> None:
        """A check woken :data:`PAUSE_AFTER_S` late: the node was paused; the stall
        allowance of the tick it waits for starts again from ``now``."""
        last, self._last_check = self._last_check, real_now
        if last is None:
            return
        gap = real_now - last
        if gap - CHECK_EVERY_S <= PAUSE_AFTER_S:
            return
        with self._lock:
            self._resumed_at = now
            if self._tick_seen_fired is not None:
                self._tick_seen_fired = real_now
            self.pauses += 1
            self.paused_s += gap
        log.warning(
            "the node was paused for %.1f s (stopped, frozen or not scheduled); "
            "supervision goes on from now",
            gap,
        )

    def _run(self) -> None:
        while not self._stopped.wait(CHECK_EVERY_S):
            if self.check() is not None:
                return

    def _dead_actor(self) -> tuple[str, str] | None:
        with self._lock:
            actors = dict(self._actors)
            causes = dict(self._causes)
        for name, ref in actors.items():
            if not ref.is_alive():
                why = causes.get(name)
                return f"{name} actor", f"died of {why}" if why else "stopped: it is not running"
        return None

    def _stalled_tick(self, now: float, real_now: float) -> tuple[str, str] | None:
        """``now`` (node clock) was read before the tick's ``fired``: a ManualClock
        passes a due time only once it has fired the timer."""
        with self._lock:
            tick = self._tick
            if tick is None or tick.cancelled:
                return None
            if tick.fired and self._tick_seen_fired is None:
                self._tick_seen_fired = real_now
            seen_fired = self._tick_seen_fired
            clock_error = self._clock_error
            late_from = tick.due if self._resumed_at is None else max(tick.due, self._resumed_at)
        also = f"; last clock callback error: {clock_error}" if clock_error else ""
        if not tick.fired and now - late_from > self._stall_s:
            late = now - tick.due
            return "supervision ticks", (
                f"the health tick due {late:.1f} s ago has not fired: "
                f"the clock's timer thread is stuck or gone{also}"
            )
        if seen_fired is not None and real_now - seen_fired > self._stall_s:
            return "supervision ticks", (
                f"the supervisor has not handled its health tick for "
                f"{real_now - seen_fired:.1f} s: it is blocked{also}"
            )
        return None
