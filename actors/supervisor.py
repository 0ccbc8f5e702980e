"""The supervisor actor: sends every instance its health and reconcile ticks,
and keeps the controller lease.

Ticks run on the injected clock, so a test advances time instead of sleeping.
The instance decides what a tick means; the supervisor never blocks on it.
The lease (opt-in, ``reference/host_supervise.rs.txt`` ``expire_lease``): the
supervisor records when it last heard from a controller other than this node;
once that is longer ago than the lease, each instance is told, and those that
another node placed stop (phase "lease") and stay stopped.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import ProbeError
from infervisor.adapters.ports import wide_listeners

from . import messages as m
from .clock import Clock, Timer

__all__ = ["SupervisorActor"]

log = logging.getLogger(__name__)


class _Tick(msgspec.Struct, frozen=True):
    what: str


class SupervisorActor(pykka.ThreadingActor):
    """Fans out :class:`HealthTick` every ``health_interval_s`` and
    :class:`ReconcileTick` every ``reconcile_interval_s`` (seconds)."""

    def __init__(
        self,
        clock: Clock,
        health_interval_s: float,
        reconcile_interval_s: float,
        lease_s: float | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._intervals = {"health": health_interval_s, "reconcile": reconcile_interval_s}
        self._instances: dict[str, pykka.ActorRef[Any]] = {}
        self._timers: dict[str, Timer] = {}
        self._host: pykka.ActorRef[Any] | None = None
        self._lease = lease_s
        self._last_contact = clock.monotonic()
        self._expired_told = False

    def on_start(self) -> None:
        for what in self._intervals:
            self._schedule(what)

    def on_stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()

    def _schedule(self, what: str) -> None:
        ref = self.actor_ref

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Tick(what))

        self._timers[what] = self._clock.call_later(self._intervals[what], fire)

    def on_receive(self, message: Any) -> Any:
        match message:
            case m.Register(instance_id=iid, ref=ref):
                self._instances[iid] = ref
            case m.Deregister(instance_id=iid):
                self._instances.pop(iid, None)
            case m.WatchedBy(host=host):
                self._host = host
            case m.Heard():
                self._last_contact = self._clock.monotonic()
                self._expired_told = False
            case _Tick(what="health"):
                self._revive_dead()
                self._check_lease()
                self._fan_out(m.HealthTick())
                self._schedule("health")
            case _Tick(what=what):
                self._fan_out(m.ReconcileTick(listeners=_wide_listeners()))
                self._schedule(what)
        return None

    def _revive_dead(self) -> None:
        """An instance actor that died is noticed within one tick and recreated."""
        dead = [iid for iid, ref in self._instances.items() if not ref.is_alive()]
        for iid in dead:
            del self._instances[iid]
            if self._host is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    self._host.tell(m.Revive(instance_id=iid))

    def _check_lease(self) -> None:
        if self._lease is None or self._expired_told:
            return
        silent = self._clock.monotonic() - self._last_contact
        if silent > self._lease:
            self._expired_told = True
            self._fan_out(m.LeaseExpired(silent_s=silent))

    def _fan_out(self, tick: Any) -> None:
        for ref in list(self._instances.values()):
            try:
                ref.tell(tick)
            except pykka.ActorDeadError:
                continue


def _wide_listeners() -> dict[int, list[str]] | None:
    try:
        return wide_listeners()
    except ProbeError as e:
        log.warning("exposure checks skipped this tick: %s", e)
        return None
