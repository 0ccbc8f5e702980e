"""The node's probes on a grid (actors/timer_wheel.py, issue 22): timers due in
the same slot fire from one timer of the clock beneath, a cancelled one never
runs, and a probe loop on the grid keeps its cadence (no drift, no probe lost)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from test_probe_loop import Rig

from infervisor.actors.clock import ManualClock, Timer
from infervisor.actors.core.wake import Wake
from infervisor.actors.probe_loop import ProbeLoop
from infervisor.actors.timer_wheel import TimerWheel


class Counting(ManualClock):
    """A manual clock that counts the timers armed on it."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = 0

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        self.armed += 1
        return super().call_later(delay, fn)


def test_timers_of_one_slot_fire_from_one_timer_and_a_cancelled_one_never() -> None:
    clock = Counting()
    wheel = TimerWheel(clock, 0.01)
    ran: list[str] = []
    for name, delay in (("a", 0.100), ("b", 0.1031), ("c", 0.0962), ("d", 0.2)):
        wheel.call_later(delay, lambda name=name: ran.append(name))
    wheel.call_later(0.1, lambda: ran.append("cancelled")).cancel()
    assert clock.armed == 2  # the slot at 0.10 s and the one at 0.20 s
    wheel.call_later(0.0, lambda: ran.append("now"))
    assert clock.armed == 3  # "now" is not rounded
    clock.advance(0.0)
    assert ran == ["now"]
    ran.clear()
    clock.advance(0.0999)
    assert ran == []
    clock.advance(0.0001)
    assert ran == ["a", "b", "c"]  # each within half a slot of its time
    clock.advance(0.1)
    assert ran == ["a", "b", "c", "d"]
    assert wheel.early_s > 0.005


def test_the_rest_of_a_slot_runs_when_one_raises() -> None:
    clock = ManualClock()
    wheel = TimerWheel(clock, 0.01)
    ran: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    wheel.call_later(0.05, boom)
    wheel.call_later(0.05, lambda: ran.append(1))
    clock.advance(0.05)  # the clock beneath logs what its timer raised
    assert ran == [1]
    with pytest.raises(ValueError, match="slot_s"):
        TimerWheel(clock, 0.0)


def test_a_probe_loop_on_the_grid_keeps_its_cadence() -> None:
    rig = Rig()
    rig.loop = ProbeLoop(TimerWheel(rig.clock, 0.01), rig._send, rig._wake)
    rig.clock.advance(0.0042)  # off the grid
    rig.running()
    rig.clock.advance(1.0)
    assert rig.woken == [Wake.UNSTEADY, Wake.CHANGED]
    sent = len(rig.sent)
    rig.clock.advance(60.0)
    assert len(rig.sent) - sent == 60  # every due probe, none lost to the rounding
    assert all(abs(gap - 1.0) <= 0.006 for gap in rig.gaps(sent))
    assert rig.loop.quiet >= 60


class Late:
    """Timers that fire ``late_s`` after they are due (a busy engine loop)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.late_s = 0.0

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        return self.clock.call_later(delay + self.late_s, fn)


def test_probes_sent_late_do_not_drift_the_cadence() -> None:
    rig = Rig()
    late = Late(rig.clock)
    rig.loop = ProbeLoop(late, rig._send, rig._wake)
    rig.running()
    rig.clock.advance(1.0)
    late.late_s = 0.003  # every timer 3 ms late from now on
    sent = len(rig.sent)
    rig.clock.advance(60.0)
    assert len(rig.sent) - sent == 60  # counted from when each was due: none lost
    late.late_s = 0.7  # a stall longer than half an interval: counted from the send
    rig.clock.advance(10.0)
    assert all(gap >= 1.0 for gap in rig.gaps(len(rig.sent) - 4))  # no burst to catch up
