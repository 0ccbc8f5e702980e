"""The supervisor actor: sends every instance its health and reconcile ticks,
and keeps the controller lease.

Ticks run on the injected clock, so a test advances time instead of sleeping.
The instance decides what a tick means; the supervisor never blocks on it.
The lease (opt-in, ``reference/host_supervise.rs.txt`` ``expire_lease``): the
supervisor keeps when it last heard from a controller other than this node;
once that is longer ago than the lease, each instance is told, and those that
another node placed stop (phase "lease") and stay stopped.

The lease survives a node restart: a controller heard is recorded
(``node.lease_renewed``, source "controller") at most once per
:data:`RENEW_FRACTION` of the lease, so the chain grows by a bounded number of
rows whatever the heartbeat rate; at boot the lease runs from the last one
recorded, not from the boot. A restart may thereby shorten the lease by up to
that fraction, and never lengthens it. An instance actor registered while the
lease is expired (a boot after the silence began) is told so at once.

A pause is not a controller's silence: a health tick fired more than
:data:`~.watchdog.PAUSE_AFTER_S` after it was due means the node did not run
(stopped, frozen, starved), so no controller could reach it; that time is
excused from the lease (issue 17). It is not recorded: a restart counts the
lease from the last renewal recorded, as before.

Each health tick is handed to the node's :class:`~.watchdog.Watchdog`, which
declares the node failed when ticks stop; a tick whose handling raises is
logged and the ticks go on.
"""

from __future__ import annotations

import contextlib
import logging
from types import TracebackType
from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import ProbeError
from infervisor.adapters.ports import ListenerSnapshot, listener_snapshot
from infervisor.adapters.proc.system import REAL
from infervisor.replay import events as ev
from infervisor.replay.state import LeaseRecord, Stamp, elapsed_s

from . import messages as m
from .append import WriterAppend
from .clock import Clock, Timer
from .stamps import now_stamp
from .watchdog import PAUSE_AFTER_S, Watchdog

__all__ = ["RENEW_FRACTION", "LeaseKeeper", "SupervisorActor"]

log = logging.getLogger(__name__)

#: A heard controller is recorded at most once per this fraction of the lease.
RENEW_FRACTION = 0.25


class _Tick(msgspec.Struct, frozen=True):
    what: str


class LeaseKeeper:
    """The controller lease's arithmetic, on the monotonic clock (seconds).

    Args:
        lease_s: the lease, seconds.
        now: the moment the keeper starts (the node's boot).
        since: the last renewal the chain has; None: the lease runs from ``now``.
    """

    def __init__(self, lease_s: float, now: Stamp, since: LeaseRecord | None) -> None:
        self.lease_s = lease_s
        silent = elapsed_s(since.at, now) if since is not None else 0.0
        self.last_contact = now.mono_s - silent
        #: When a renewal was last recorded (None: none yet, or the last one failed).
        self.last_recorded: float | None = self.last_contact if since is not None else None
        self._expired_told = False

    def heard(self, now_s: float) -> bool:
        """A controller was heard at ``now_s``; True when this one is to be recorded."""
        self.last_contact = now_s
        self._expired_told = False
        last = self.last_recorded
        if last is not None and now_s - last < self.lease_s * RENEW_FRACTION:
            return False
        self.last_recorded = now_s
        return True

    def excuse(self, seconds: float, now_s: float) -> None:
        """The node did not run for ``seconds`` before ``now_s``: no controller could
        reach it, so that time is not silence (a lease told expired stays so)."""
        self.last_contact = min(now_s, self.last_contact + seconds)

    def not_recorded(self) -> None:
        """The last renewal could not be recorded: record the next one heard."""
        self.last_recorded = None

    def silence(self, now_s: float) -> float | None:
        """Seconds of silence at ``now_s`` when they exceed the lease, else None."""
        silent = now_s - self.last_contact
        return silent if silent > self.lease_s else None

    def expired(self, now_s: float) -> float | None:
        """:meth:`silence`, only the first time (until a controller is heard again)."""
        silent = self.silence(now_s)
        if self._expired_told or silent is None:
            return None
        self._expired_told = True
        return silent


class SupervisorActor(pykka.ThreadingActor):
    """Fans out :class:`HealthTick` every ``health_interval_s`` and
    :class:`ReconcileTick` every ``reconcile_interval_s`` (seconds).

    Args:
        clock: the node's clock.
        health_interval_s: the health tick's period, seconds.
        reconcile_interval_s: the reconcile tick's period, seconds.
        lease_s: the controller lease, seconds (None: no lease, nothing recorded).
        writer: the chain writer, to record renewals of the lease.
        lease: the last renewal the chain has (``NodeState.lease``).
        watchdog: told of every health tick armed, and of this actor's failure.
    """

    def __init__(
        self,
        clock: Clock,
        health_interval_s: float,
        reconcile_interval_s: float,
        lease_s: float | None = None,
        *,
        writer: pykka.ActorRef[Any] | None = None,
        lease: LeaseRecord | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._intervals = {"health": health_interval_s, "reconcile": reconcile_interval_s}
        self._instances: dict[str, pykka.ActorRef[Any]] = {}
        self._timers: dict[str, Timer] = {}
        self._host: pykka.ActorRef[Any] | None = None
        self._writer = writer
        self._watchdog = watchdog
        self._lease = None if lease_s is None else LeaseKeeper(lease_s, now_stamp(clock), lease)
        self._renewal: pykka.Future[Any] | None = None

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

    def _schedule(self, what: str) -> None:
        ref = self.actor_ref

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Tick(what))

        timer = self._clock.call_later(self._intervals[what], fire)
        self._timers[what] = timer
        if what == "health" and self._watchdog is not None:
            self._watchdog.watch_tick(timer)

    def on_receive(self, message: Any) -> Any:
        match message:
            case m.Register(instance_id=iid, ref=ref):
                self._instances[iid] = ref
                self._tell_lapsed(ref)
            case m.Deregister(instance_id=iid):
                self._instances.pop(iid, None)
            case m.WatchedBy(host=host):
                self._host = host
            case m.Heard(controller=controller):
                self._heard(controller)
            case m.IsSettled():
                return True  # answered after the ticks before it were told (Node.settled)
            case m.ShuttingDown():
                self._lease = None
            case _Tick(what=what):
                self._tick(what)
        return None

    def _tick(self, what: str) -> None:
        """One tick; whatever it raises is logged, and the next is always armed."""
        try:
            if what == "health":
                self._revive_dead()
                self._excuse_pause()
                self._check_lease()
                self._fan_out(m.HealthTick())
            else:
                tick = m.ReconcileTick(listeners=_listeners(), processes=REAL.table())
                self._fan_out(tick)
        except Exception:
            log.exception("supervisor: the %s tick failed; the ticks go on", what)
        finally:
            self._schedule(what)

    def _revive_dead(self) -> None:
        """An instance actor that died is noticed within one tick and recreated."""
        dead = [iid for iid, ref in self._instances.items() if not ref.is_alive()]
        for iid in dead:
            del self._instances[iid]
            if self._host is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    self._host.tell(m.Revive(instance_id=iid))

    def _fan_out(self, tick: Any) -> None:
        for ref in list(self._instances.values()):
            try:
                ref.tell(tick)
            except pykka.ActorDeadError:
                continue

    # ------------------------------------------------------------------ the lease
    def _excuse_pause(self) -> None:
        """A health tick fired :data:`PAUSE_AFTER_S` late: the node was paused (the
        clock's own lateness: a supervisor slow to handle it is not a pause)."""
        timer = self._timers.get("health")
        if self._lease is None or timer is None or timer.fired_at is None:
            return
        late = timer.fired_at - timer.due
        if late > PAUSE_AFTER_S:
            log.warning("the node did not run for %.1f s: excused from the lease", late)
            self._lease.excuse(late, self._clock.monotonic())

    def _check_lease(self) -> None:
        if self._lease is None:
            return
        silent = self._lease.expired(self._clock.monotonic())
        if silent is not None:
            self._fan_out(m.LeaseExpired(silent_s=silent))

    def _tell_lapsed(self, ref: pykka.ActorRef[Any]) -> None:
        """An actor registered while the lease is expired (at boot, after a silence
        that began before the restart; or revived) is told at once."""
        if self._lease is None:
            return
        silent = self._lease.silence(self._clock.monotonic())
        if silent is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(m.LeaseExpired(silent_s=silent))

    def _heard(self, controller: str) -> None:
        if self._lease is None:
            return
        self._check_renewal()
        now = now_stamp(self._clock)
        if self._lease.heard(now.mono_s):
            self._record_renewal(controller, now)

    def _record_renewal(self, controller: str, at: Stamp) -> None:
        """Append ``node.lease_renewed`` without waiting (the writer answers a future;
        an append that fails there leaves the writer running)."""
        assert self._lease is not None
        if self._writer is None:
            return
        event = ev.LeaseRenewed(controller=controller, at=at)
        try:
            chain = WriterAppend(self._writer, self._clock)
            self._renewal = chain.submit([event], source="controller", ts_ns=at.wall_ns)
        except pykka.ActorDeadError:
            # The watchdog declares the node failed; nothing to add but the loss.
            log.error("lease renewal by %s not recorded: the chain writer is gone", controller)  # noqa: TRY400
            self._lease.not_recorded()

    def _check_renewal(self) -> None:
        """The last renewal's append, once answered: a failure is logged, the next recorded."""
        renewal, self._renewal = self._renewal, None
        if renewal is None:
            return
        try:
            renewal.get(timeout=0)
        except pykka.Timeout:
            self._renewal = renewal  # still in flight
        except Exception as e:  # noqa: BLE001 - whatever failed the append: log it, retry
            log.warning("a lease renewal was not recorded (%s); recording the next one", e)
            assert self._lease is not None
            self._lease.not_recorded()


def _listeners() -> ListenerSnapshot | None:
    """One socket-table snapshot, with owners, for every instance this tick."""
    try:
        return listener_snapshot()
    except ProbeError as e:
        log.warning("exposure checks skipped this tick: %s", e)
        return None
