"""Timers on a grid: every timer due in the same slot fires from one timer of the
clock beneath, in one pass.

The probe engine's loop woke once per probe when each instance armed a timer
of its own (a 1,000-instance node: 1,000 loop wake-ups a second to send, each
a pass of asyncio's loop, a ``select`` and the GIL taken again). On a grid of
``slot_s`` seconds the instances whose probes fall due in the same slot are
sent in one pass, and their answers come back together: the wake-ups per
second are bounded by ``1 / slot_s``, not by the number of instances.

A timer is rounded to the nearest grid point, so it fires at most ``slot_s / 2``
early or late (plus the loop's own lateness; a timer for now is not rounded):
:attr:`TimerWheel.early_s` is how early, for a caller that checks a timer is
due (actors/probe_loop.py, which counts its cadence from when each probe was
due, so the rounding does not drift it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Protocol

from infervisor.adapters.probe_engine import Later  # one timer of a slot: cancellable

__all__ = ["Cancellable", "TimerWheel", "Timers"]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """A monotonic clock with timers (the probe engine, a :class:`~.clock.Clock`)."""

    def monotonic(self) -> float: ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> Cancellable: ...


class TimerWheel:
    """:class:`Timers` on ``timers`` (the clock beneath), rounded to a grid of
    ``slot_s`` seconds; thread-safe. A timer's ``fn`` runs on the thread the
    clock beneath runs its timers on; one that raises is the clock's to report
    (the probe engine logs it), and the rest of its slot still runs."""

    def __init__(self, timers: Timers, slot_s: float) -> None:
        if slot_s <= 0:
            raise ValueError(f"slot_s must be > 0 seconds, not {slot_s!r}")
        self._timers = timers
        self._slot_s = slot_s
        #: How early a timer may fire, seconds (half a slot, and a hair for the clock).
        self.early_s = slot_s / 2 + 0.001
        self._lock = threading.Lock()
        self._slots: dict[int, list[Later]] = {}

    def monotonic(self) -> float:
        """The clock beneath's monotonic time, seconds."""
        return self._timers.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Cancellable:
        """Run ``fn`` at the grid point nearest ``delay`` seconds from now (at once,
        off the grid, when ``delay`` is 0 or less: "now" is not rounded)."""
        if delay <= 0:
            return self._timers.call_later(0.0, fn)
        now = self._timers.monotonic()
        slot = round((now + max(delay, 0.0)) / self._slot_s)
        entry = Later(fn)
        with self._lock:
            entries = self._slots.get(slot)
            if entries is not None:
                entries.append(entry)
                return entry
            self._slots[slot] = [entry]
        self._timers.call_later(max(0.0, slot * self._slot_s - now), partial(self._fire, slot))
        return entry

    def _fire(self, slot: int) -> None:
        with self._lock:
            entries = self._slots.pop(slot, ())
        failed: BaseException | None = None
        for entry in entries:
            if entry.cancelled:
                continue
            try:
                entry.fn()
            except Exception as e:  # noqa: BLE001 - the others of the slot still run
                failed = failed or e
        if failed is not None:
            raise failed
