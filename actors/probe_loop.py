"""The probe engine's schedule of one instance: probes sent on their own timers,
reports handed to the instance's actor only when the core says they wake it.

Before, every probe woke the instance's actor thread twice (the supervisor's
health tick, then the report back). Now a :class:`ProbeLoop` sends the
instance's probes itself, one ``interval_s`` after the last one was due
(sent, if it went more than half an interval late; the readiness cadence
while the instance starts; :mod:`.core.pacing`), and
judges nothing: :func:`~.core.wake.wake_for` says whether a report wakes the
actor (a miss, a changed verdict, a deep check or the stability reset due,
an instance not steady), and the actor decides it as it always did. A report
that wakes nothing is kept for status (:attr:`ProbeLoop.report`).

The schedule follows the actor's :class:`~.core.wake.Watch`, published after
each decision; a new cadence (the instance began or ended its start-up)
counts from the moment it is published. No second probe goes while one is out; a probe is sent with
the token of the moment, and a report for another token is the core's to
ignore. Timers run on :class:`Timers`: the node's probe engine (its loop's
own thread, where the reports land: a steady probe hands nothing between
threads) or, in tests, a :class:`~.clock.ManualClock`. Every entry point is
thread-safe (one lock, never held while sending or telling).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import msgspec

from infervisor.adapters.probe import ServerReport

from .core.wake import PortListeners, Reconcile, Seen, Wake, Watch, reconcile_for, wake_for
from .timer_wheel import Cancellable, Timers

__all__ = ["Gates", "ProbeLoop", "Probed", "Send", "Timers"]

#: A timer that fires a hair early (the engine's loop rounds to its clock's
#: resolution) still counts as due: seconds. Timers on a grid say how early
#: theirs may fire (:attr:`~.timer_wheel.TimerWheel.early_s`).
_EARLY_S = 0.001


class Probed(msgspec.Struct, frozen=True):
    """A probe's report, back to the actor (``wake``: why it was handed over)."""

    token: int
    report: ServerReport
    latency_s: float  # from sending the probe to its report, seconds
    active: int | None = None  # the server's own count of requests in progress (None: unknown)
    wake: Wake | None = None


#: Sends one probe for a token; its :class:`Probed` comes back through the
#: callback, on any thread, always (a probe that fails is a report).
Send = Callable[[int, Callable[[Probed], None]], None]


class ProbeLoop:
    """One instance's probes. ``wake(probed)`` hands a report to its actor.

    Attributes:
        report: the last probe's report (None before the first).
        latency_s: how long the last probe took, seconds (None before the first).
        woken: reports handed to the actor, per reason.
        quiet: reports that woke nothing.
        reconciled: reconcile ticks that wake the actor, per reason.
        reconcile_quiet: reconcile ticks that did not.
    """

    def __init__(self, timers: Timers, send: Send, wake: Callable[[Probed], None]) -> None:
        self._timers, self._send, self._wake = timers, send, wake
        self._early_s: float = max(_EARLY_S, getattr(timers, "early_s", 0.0))
        self._lock = threading.Lock()
        self._watch = Watch()
        self._timer: Cancellable | None = None
        self._timer_due_s = 0.0
        self._out = False
        self._last_sent_s: float | None = None
        self._reported: Seen | None = None
        self._closed = False
        self.report: ServerReport | None = None
        self._of: tuple[int, ServerReport] | None = None  # the last report and its token
        self.latency_s: float | None = None
        self.woken: Counter[Wake] = Counter()
        self.quiet = 0
        self._told: PortListeners = None
        self.reconciled: Counter[Reconcile] = Counter()
        self.reconcile_quiet = 0

    @property
    def probing(self) -> bool:
        """A probe is out."""
        return self._out

    def report_of(self, token: int) -> ServerReport | None:
        """The last probe's report when it was of ``token`` (the server's pid: a
        report of the process before a restart says nothing of this one), else None
        (any thread)."""
        last = self._of
        return last[1] if last is not None and last[0] == token else None

    def publish(self, watch: Watch) -> None:
        """The actor's watch after a decision: the schedule follows it."""
        with self._lock:
            before, self._watch = self._watch, watch
            if before.interval_s != watch.interval_s and self._last_sent_s is not None:
                # A new cadence (start-up began or ended) counts from now.
                self._last_sent_s = self._timers.monotonic()
        if (before.probe, before.interval_s) != (watch.probe, watch.interval_s):
            self._plan()

    def afresh(self) -> None:
        """Probe at once, and hand its report over whatever it says (what was
        observed while the chain did not record is no verdict)."""
        with self._lock:
            self._reported = None
            self._last_sent_s = None
        self._plan()

    def kick(self) -> None:
        """Send the probe now if one is due (a health tick told to the actor)."""
        self._fire()

    def close(self) -> None:
        """Send nothing more and hand nothing over (the actor stops)."""
        with self._lock:
            self._closed = True
            self._cancel()

    def reported(self, probed: Probed) -> None:
        """A probe's report (any thread): hand it over if it wakes the actor."""
        with self._lock:
            self._out = False
            if self._closed:
                return
            self.report, self.latency_s = probed.report, probed.latency_s
            self._of = (probed.token, probed.report)  # one assignment: read whole anywhere
            seen = Seen(probed.token, probed.report, probed.active)
            reason = wake_for(self._watch, seen, self._reported, self._timers.monotonic())
            if reason is None:
                self.quiet += 1
            else:
                # Only a report decided on a steady state is a baseline: deciding
                # its equal again is a no-op (one decided while starting was not).
                self._reported = seen if self._watch.steady else None
                self.woken[reason] += 1
        if reason is not None:
            self._wake(msgspec.structs.replace(probed, wake=reason))
        self._plan()

    def reconcile(self, ports: dict[int, list[str]] | None) -> Reconcile | None:
        """Whether a reconcile tick wakes the actor (any thread; the caller tells
        it the tick on a reason). ``ports``: the tick's listeners beyond loopback
        by port (None: the socket table could not be read). After :meth:`close`,
        always a reason: the actor, if any, decides."""
        with self._lock:
            watch = self._watch
            seen = None if ports is None else tuple(ports.get(watch.port, ()))
            reason = reconcile_for(watch, seen, self._told)
            if self._closed and reason is None:
                reason = Reconcile.TICKS
            if reason is None:
                self.reconcile_quiet += 1
                return None
            self.reconciled[reason] += 1
            if seen is not None:
                self._told = seen
            return reason

    # ------------------------------------------------------------------ schedule
    def _next_due_s(self) -> float | None:
        """When the next probe is due (None: none is wanted, or one is out)."""
        if self._closed or self._out or not self._watch.probe:
            return None
        last = self._last_sent_s
        return None if last is None else last + self._watch.interval_s

    def _plan(self) -> None:
        """Arm the timer for the next probe (an earlier one armed is kept: it plans again)."""
        with self._lock:
            if self._closed or self._out or not self._watch.probe:
                self._cancel()
                return
            now = self._timers.monotonic()
            due = self._next_due_s()
            due = now if due is None else max(due, now)
            if self._timer is not None and self._timer_due_s <= due:
                return
            self._cancel()
            self._timer_due_s = due
            self._timer = self._timers.call_later(due - now, self._fire)

    def _fire(self) -> None:
        """Send the probe if it is due; else plan again."""
        token = 0
        with self._lock:
            self._cancel()
            due = self._next_due_s()
            now = self._timers.monotonic()
            send = self._watch.probe and not self._out and not self._closed
            send = send and (due is None or now >= due - self._early_s)
            if send:
                self._out, token = True, self._watch.token
                self._last_sent_s = _counted_from(due, now, self._watch.interval_s)
        if send:
            self._send(token, self.reported)
        else:
            self._plan()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _counted_from(due: float | None, now: float, interval_s: float) -> float:
    """When a probe sent ``now`` counts as sent, for the next one's due time: when it
    was due, if it went within half an interval of that (a probe a busy loop sent a
    little late, or a grid's timer a little early, moves no later probe: the
    cadence does not drift), else now (after a long stall, no burst to catch up)."""
    if due is None or abs(now - due) > interval_s / 2:
        return now
    return due


class Gates:
    """The node's probe loops by instance id, for the supervisor's reconcile tick
    (thread-safe): an instance whose loop says its tick changes nothing is not
    woken (:func:`~.core.wake.reconcile_for`). An instance without a loop here is
    always told."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: dict[str, ProbeLoop] = {}

    def put(self, iid: str, loop: ProbeLoop) -> None:
        """``loop`` is the instance's (a revived actor's replaces its predecessor's)."""
        with self._lock:
            self._loops[iid] = loop

    def drop(self, iid: str, loop: ProbeLoop) -> None:
        """Forget ``loop`` (only if it is still the instance's)."""
        with self._lock:
            if self._loops.get(iid) is loop:
                del self._loops[iid]

    def wakes(self, iid: str, ports: dict[int, list[str]] | None) -> bool:
        """Whether the reconcile tick with ``ports`` (see :meth:`ProbeLoop.reconcile`)
        wakes the instance ``iid``."""
        with self._lock:
            loop = self._loops.get(iid)
        return loop is None or loop.reconcile(ports) is not None
