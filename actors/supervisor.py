"""The supervisor actor: keeps the health tick (the leases, the watchdog, dead
instance actors revived), sends the instances their reconcile tick, and
executes the controller leases' decisions. The instances' probes are not the
health tick's: each instance's probe engine schedules its own
(actors/probe_loop.py), so an idle instance's actor is not woken per tick.
Nor is it woken by a reconcile tick that changes nothing for it: the core's
reconcile rule (:func:`~.core.wake.reconcile_for`, asked through the node's
:class:`~.probe_loop.Gates`) tells an adopted server only a change of the
listeners on its port; the process table is read only when some instance is
told.

Ticks run on the injected clock, so a test advances time instead of sleeping.
The instance decides what a tick means; the supervisor never blocks on it.
The leases (opt-in, one per controller) are decided in the core
(:mod:`.core.lease`: renewals, lapses, pauses excused); the supervisor feeds
it what it sees (a controller heard, a health tick and how late it fired, an
instance registered with the controller that placed it, a renewal whose
append failed), appends the renewals it asks for without waiting, and tells
the instances the lapsed controller placed that its lease lapsed
(``LeaseExpired``): only those (issue 19).

Each health tick is handed to the node's :class:`~.watchdog.Watchdog`, which
declares the node failed when ticks stop; a tick whose handling raises is
logged and the ticks go on.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import ProbeError
from infervisor.adapters.ports import ListenerSnapshot, listener_snapshot
from infervisor.adapters.proc.system import REAL
from infervisor.replay import events as ev
from infervisor.replay.state import LeaseRecord, RunClock, Stamp

from . import messages as m
from .append import WriterAppend
from .clock import Clock, Timer
from .core import lease as rule
from .probe_loop import Gates
from .reconcile_facts import listener_ports
from .stamps import now_stamp
from .watchdog import PAUSE_AFTER_S, Watchdog

__all__ = ["SupervisorActor", "TickKind"]

log = logging.getLogger(__name__)


class TickKind(enum.StrEnum):
    """The supervisor's two periodic ticks."""

    HEALTH = "health"
    RECONCILE = "reconcile"


class _Tick(msgspec.Struct, frozen=True):
    what: TickKind


class SupervisorActor(pykka.ThreadingActor):
    """Ticks health every ``health_interval_s`` (leases, watchdog, revivals) and
    fans out :class:`ReconcileTick` every ``reconcile_interval_s`` (seconds).

    Args:
        clock: the node's clock.
        health_interval_s: the health tick's period, seconds.
        reconcile_interval_s: the reconcile tick's period, seconds.
        lease_s: the controller lease, seconds (None: no lease, nothing recorded).
        writer: the chain writer, to record renewals of the leases.
        leases: each controller's last renewal the chain has (``NodeState.leases``).
        run: how long the node ran, as the chain tells it (``NodeState.run``):
            the leases count only that time as silence at boot.
        startup_s: seconds the node process spent starting before this actor
            (excused from the leases at boot: nobody could reach the node).
        watchdog: told of every health tick armed, and of this actor's failure.
        gates: the instances' probe loops, asked whether a reconcile tick wakes
            each (None: every instance is told every tick).
    """

    def __init__(
        self,
        clock: Clock,
        health_interval_s: float,
        reconcile_interval_s: float,
        lease_s: float | None = None,
        *,
        writer: pykka.ActorRef[Any] | None = None,
        leases: Mapping[str, LeaseRecord] | None = None,
        run: RunClock | None = None,
        watchdog: Watchdog | None = None,
        startup_s: float = 0.0,
        gates: Gates | None = None,
    ) -> None:
        super().__init__()
        self._gates = gates
        self._clock = clock
        self._intervals = {
            TickKind.HEALTH: health_interval_s,
            TickKind.RECONCILE: reconcile_interval_s,
        }
        self._instances: dict[str, pykka.ActorRef[Any]] = {}
        self._placed_by: dict[str, str] = {}  # whose lease each is under ("": none)
        self._timers: dict[TickKind, Timer] = {}
        self._host: pykka.ActorRef[Any] | None = None
        self._writer = writer
        self._watchdog = watchdog
        self._lease: rule.Lease | None = None
        if lease_s is not None:
            policy = rule.LeasePolicy(lease_s=lease_s, pause_after_s=PAUSE_AFTER_S)
            self._lease = rule.lease_at_boot(
                policy, now_stamp(clock), leases or {}, run or RunClock(), startup_s
            )
        self._renewals: dict[str, pykka.Future[Any]] = {}

    def on_start(self) -> None:
        for what in self._intervals:
            self._schedule(what)

    def on_stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for timer in self._timers.values():
            timer.cancel()
        if self._watchdog is not None and exception_value is not None:
            self._watchdog.actor_failed("supervisor", exception_value)

    def _schedule(self, what: TickKind) -> None:
        ref = self.actor_ref

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Tick(what))

        timer = self._clock.call_later(self._intervals[what], fire)
        self._timers[what] = timer
        if what is TickKind.HEALTH and self._watchdog is not None:
            self._watchdog.watch_tick(timer)

    def on_receive(self, message: Any) -> Any:
        match message:
            case m.Register(instance_id=iid, ref=ref, placed_by=placed_by):
                self._instances[iid] = ref
                self._placed_by[iid] = placed_by
                if placed_by:
                    self._decide_lease(rule.InstanceRegistered(placed_by), registered=ref)
            case m.Deregister(instance_id=iid):
                self._instances.pop(iid, None)
                self._placed_by.pop(iid, None)
            case m.WatchedBy(host=host):
                self._host = host
            case m.Heard(controller=controller):
                return self._heard(controller)
            case m.IsSettled():
                return True  # answered after the ticks before it were told (Node.settled)
            case m.ShuttingDown():
                self._lease = None
            case _Tick(what=what):
                self._tick(what)
        return None

    def _tick(self, what: TickKind) -> None:
        """One tick; whatever it raises is logged, and the next is always armed."""
        try:
            if what is TickKind.HEALTH:
                self._revive_dead()
                self._decide_lease(rule.HealthTickFired(late_s=self._health_late_s()))
            else:
                self._reconcile()
        except Exception:
            log.exception("supervisor: the %s tick failed; the ticks go on", what)
        finally:
            self._schedule(what)

    def _revive_dead(self) -> None:
        """An instance actor that died is noticed within one tick and recreated."""
        dead = [iid for iid, ref in self._instances.items() if not ref.is_alive()]
        for iid in dead:
            del self._instances[iid]
            self._placed_by.pop(iid, None)
            if self._host is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    self._host.tell(m.Revive(instance_id=iid))

    def _reconcile(self) -> None:
        """Tell the reconcile tick to every instance it wakes (one socket snapshot,
        and one process table read only when some instance is told)."""
        listeners = _listeners()
        gates = self._gates
        if gates is None:
            woken = list(self._instances.values())
        else:
            ports = None if listeners is None else listener_ports(listeners)
            woken = [ref for iid, ref in self._instances.items() if gates.wakes(iid, ports)]
        if woken:
            self._fan_out(woken, m.ReconcileTick(listeners=listeners, processes=REAL.table()))

    def _fan_out(self, refs: list[pykka.ActorRef[Any]], tick: Any) -> None:
        for ref in refs:
            try:
                ref.tell(tick)
            except pykka.ActorDeadError:
                continue

    # ------------------------------------------------------------------ the lease
    def _health_late_s(self) -> float:
        """How late the health tick fired, on the clock's own account (a supervisor
        slow to handle it is not a pause)."""
        timer = self._timers.get(TickKind.HEALTH)
        if timer is None or timer.fired_at is None:
            return 0.0
        return timer.fired_at - timer.due

    def _heard(self, controller: str) -> bool:
        """A controller other than this node was heard: its lease is renewed. True
        when its lease had lapsed before (the heartbeat's answer says so)."""
        self._check_renewal(controller)
        decision = self._decide_lease(rule.ControllerHeard(controller))
        return decision is not None and decision.was_lapsed

    def _decide_lease(
        self, seen: rule.LeaseObservation, registered: pykka.ActorRef[Any] | None = None
    ) -> rule.LeaseDecision | None:
        """Decide in the core, then execute: append the renewal, tell who lapsed."""
        if self._lease is None:
            return None
        now = now_stamp(self._clock)
        decision = rule.decide_lease(self._lease, seen, now)
        self._lease = decision.lease
        if decision.excused_s:
            log.warning(
                "the node did not run for %.1f s: excused from the leases", decision.excused_s
            )
        for event in decision.events:
            assert isinstance(event, ev.LeaseRenewed)
            self._record_renewal(event, now)
        for lapse in decision.lapsed:
            told = m.LeaseExpired(silent_s=lapse.silent_s, controller=lapse.controller)
            if decision.audience is rule.Audience.PLACED_BY_LAPSED:
                self._tell_placed(lapse.controller, told)
            elif decision.audience is rule.Audience.REGISTERED and registered is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    registered.tell(told)
        return decision

    def _tell_placed(self, controller: str, told: m.LeaseExpired) -> None:
        """Tell the instances ``controller`` placed (and no other) that its lease lapsed."""
        for iid, ref in list(self._instances.items()):
            if self._placed_by.get(iid) == controller:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(told)

    def _record_renewal(self, event: ev.LeaseRenewed, at: Stamp) -> None:
        """Append ``node.lease_renewed`` without waiting (the writer answers a future;
        an append that fails there leaves the writer running)."""
        if self._writer is None:
            return
        try:
            chain = WriterAppend(self._writer, self._clock)
            submitted = chain.submit([event], source=rule.RENEWAL_SOURCE, ts_ns=at.wall_ns)
            self._renewals[event.controller] = submitted
        except pykka.ActorDeadError:
            # The watchdog declares the node failed; nothing to add but the loss.
            log.error("a lease renewal was not recorded: the chain writer is gone")  # noqa: TRY400
            self._decide_lease(rule.RenewalFailed(event.controller))

    def _check_renewal(self, controller: str) -> None:
        """The controller's last renewal's append, once answered: a failure is logged,
        the next recorded."""
        renewal = self._renewals.pop(controller, None)
        if renewal is None:
            return
        try:
            renewal.get(timeout=0)
        except pykka.Timeout:
            self._renewals[controller] = renewal  # still in flight
        except Exception as e:  # noqa: BLE001 - whatever failed the append: log it, retry
            log.warning("a lease renewal was not recorded (%s); recording the next one", e)
            self._decide_lease(rule.RenewalFailed(controller))


def _listeners() -> ListenerSnapshot | None:
    """One socket-table snapshot, with owners, for every instance this tick."""
    try:
        return listener_snapshot()
    except ProbeError as e:
        log.warning("exposure checks skipped this tick: %s", e)
        return None
