"""The instance actor: one per instance, sole owner of its server and state.

Every lifecycle change follows the one rule: decide, build the event, check
it against the same reducer replay uses, append it (durable), then apply it.
Slow work never runs on the actor's thread: probes run on a one-worker pool,
terminations and Ollama loads on their own threads, and each reports back as
a message, so a hung server never holds up ``status``.

What a verb means depends on the adapter's kind, so the actor hands verbs and
observations to a driver: :class:`~.process_driver.ProcessDriver` (managed
llama.cpp, mlx-lm), :class:`~.ollama_driver.OllamaDriver` (managed Ollama),
:class:`~.adopted_driver.AdoptedDriver` (observe only).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import pykka

from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.server import ServerAdapter
from infervisor.chain import EventDraft, StoredEvent
from infervisor.replay import LIVE_STATES, Desired, InstanceState, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.events import encode_event

from . import messages as m
from .clock import Clock
from .errors import InvalidState
from .ledger import Reservation
from .settings import NodeSettings

__all__ = ["Driver", "InstanceActor", "InstanceContext", "tell"]

log = logging.getLogger(__name__)


#: Probe workers for contexts built without a node (tests); a node passes its own pool.
_SHARED_FALLBACK = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")


@dataclass(frozen=True)
class InstanceContext:
    """What every instance actor of a node shares (read-only).

    ``ledger`` is the residency ledger actor, or None when the node has no
    memory budget. ``probes`` runs health probes for every instance (each has
    its own timeout, so a hung server holds one worker for that long at most).
    """

    node_id: str
    writer: pykka.ActorRef[Any]
    clock: Clock
    settings: NodeSettings
    ledger: pykka.ActorRef[Any] | None = None
    probes: Executor = field(default_factory=lambda: _SHARED_FALLBACK)


class Driver(Protocol):
    """What an instance's verbs and observations mean for one kind of adapter."""

    def start(self, by: str) -> None: ...
    def stop(self, msg: m.Stop) -> Future[m.InstanceView]: ...
    def unload(self, by: str) -> None: ...
    def wants_probe(self) -> int | None: ...
    def on_probe(self, token: int, report: ServerReport) -> None: ...
    def reconcile(self, listeners: dict[int, list[str]] | None) -> None: ...
    def boot(self) -> None: ...
    def handle(self, message: Any) -> None: ...
    def settled(self) -> bool: ...
    def pid(self) -> int | None: ...
    def close(self) -> None: ...


class _Probed(msgspec.Struct, frozen=True):
    token: int
    report: ServerReport


def tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell, ignoring an actor that has already stopped (late timers and threads)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


class InstanceActor(pykka.ThreadingActor):
    """Owns one instance. Answers verbs; acts on ticks and on its own observations."""

    def __init__(self, state: InstanceState, adapter: ServerAdapter, ctx: InstanceContext) -> None:
        super().__init__()
        self.state = state
        self.adapter = adapter
        self.ctx = ctx
        self.report: ServerReport | None = None
        self._gone = False
        spec = adapter.spec
        self.supervision = ctx.settings.supervision(spec.kind, spec.restart)
        self.memory = Reservation(ctx.ledger, state.instance_id, adapter.model_bytes)
        self._last_probe_at: float | None = None
        #: The last socket-table snapshot (ports listening beyond loopback).
        self.listeners: dict[int, list[str]] | None = None
        self._probing = False
        self._probes = ctx.probes
        self.driver: Driver = _make_driver(self)

    # ------------------------------------------------------------------ dispatch
    def on_receive(self, message: Any) -> Any:
        match message:
            case m.GetStatus():
                return self.view()
            case m.IsSettled():
                return not self._probing and self.driver.settled()
            case m.Start(by=by):
                self.driver.start(by)
                return self.view()
            case m.Stop():
                return self.driver.stop(message)
            case m.Restart(by=by):
                return self._restart(by)
            case m.Unload(by=by):
                return self.driver.unload(by)
            case m.DeepHealth():
                return self.in_thread(self.adapter.deep_health)
            case m.NewPlacement():
                return self._new_placement(message)
        try:
            self._observe(message)
        except Exception as e:
            # A handler that raises must not end the actor: the instance keeps its server.
            log.exception("%s: error handling %r", self.state.instance_id, message)
            if isinstance(message, _Probed):
                self._count_as_miss(message.token, e)
        return None

    def _count_as_miss(self, token: int, error: Exception) -> None:
        """A probe whose handling raised counts as a miss, with the error as its reason."""
        why = f"handler error: {type(error).__name__}: {error}"
        report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
        with contextlib.suppress(Exception):
            self.driver.on_probe(token, report)

    def _observe(self, message: Any) -> None:
        match message:
            case m.HealthTick():
                self._health_tick()
            case _Probed(token=token, report=report):
                self._probing = False
                self.report = report
                self.driver.on_probe(token, report)
            case m.ReconcileTick(listeners=listeners):
                if listeners is not None:
                    self.listeners = listeners
                self.driver.reconcile(listeners)
            case m.Boot():
                self.driver.boot()
            case m.LeaseExpired(silent_s=silent):
                self._lease_expired(silent)
            case _:
                self.driver.handle(message)

    def on_stop(self) -> None:
        self.driver.close()
        self.adapter.close()

    # ------------------------------------------------------------------ the one rule
    def commit(self, event: ev.InstanceEvent, source: str) -> StoredEvent:
        """Check, append (durable), then apply one event to this instance.

        Raises:
            ReplayError: the event does not fit the current state; nothing is appended.
        """
        draft = EventDraft(
            ts_ns=self.ctx.clock.wall_ns(),
            source=source,
            kind=kind_of(event),
            subject=self.state.instance_id,
            payload=encode_event(event),
        )
        if self._gone:
            raise InvalidState(f"{self.state.instance_id} is unloaded")
        apply_instance(self.state, _provisional(draft, self.state.last_seq + 1), event)
        stored: StoredEvent = self.ctx.writer.ask(m.Append(drafts=(draft,)), block=True)[0]
        new = apply_instance(self.state, stored, event)
        if new is None:
            self._gone = True  # unloaded: messages still queued must not record anything
        else:
            self.state = new
        return stored

    # ------------------------------------------------------------------ helpers for drivers
    def reserve_memory(self, by: str) -> int:
        """Reserve the model's memory before anything is spawned or loaded.

        Raises:
            BudgetExceeded: naming budget, in use and needed (the refusal is recorded).
        """
        try:
            return self.memory.take()
        except AdmissionRefused as e:
            self.commit(ev.StartRefused(by=by, reason=str(e)), by)
            raise

    def tell_self(self, message: Any) -> None:
        """Send this actor a message (from any thread)."""
        tell(self.actor_ref, message)

    def in_thread(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on its own daemon thread; its result or error lands in the Future."""
        done: Future[Any] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to whoever waits on the Future
                done.set_exception(e)

        threading.Thread(target=run, name=f"{self.state.instance_id}-work", daemon=True).start()
        return done

    def view(self) -> m.InstanceView:
        """This instance's status view (never probes)."""
        from .view import build_view  # noqa: PLC0415 - view imports drivers' types

        return build_view(self)

    # ------------------------------------------------------------------ shared verbs
    def _health_tick(self) -> None:
        token = self.driver.wants_probe()
        if token is None or self._probing:
            return
        now = self.ctx.clock.monotonic()
        last = self._last_probe_at
        # The supervisor ticks at the shortest interval of any kind; this kind's may be
        # longer. Half a tick of slack: ticks are handled with jitter, and a probe due
        # a hair after this tick must not wait a whole extra tick.
        slack = self.ctx.settings.tick_s / 2
        if last is not None and now - last < self.supervision.interval_s - slack:
            return
        self._last_probe_at = now
        self._probing = True
        self._probes.submit(self._probe_job, token)

    def _probe_job(self, token: int) -> None:
        """On a probe worker: always answer, so a probe that raises is a miss, never a
        probe that never ends."""
        try:
            report = self.adapter.probe()
        except Exception as e:  # noqa: BLE001 - reported as the probe's verdict
            why = f"probe error: {type(e).__name__}: {e}"
            report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
        self.tell_self(_Probed(token=token, report=report))

    def _new_placement(self, msg: m.NewPlacement) -> bool:
        current = self.state.generation
        if msg.generation > current:
            self.commit(
                ev.Replaced(placed_by=msg.placed_by, generation=msg.generation), "controller"
            )
            return True
        ignored = ev.PlacementIgnored(
            placed_by=msg.placed_by, generation=msg.generation, current=current
        )
        self.commit(ignored, "controller")
        return False

    def _lease_expired(self, silent_s: float) -> None:
        """Stop a continuous instance another node placed; it stays stopped."""
        state, spec = self.state, self.adapter.spec
        if not spec.continuous or state.placed_by == self.ctx.node_id:
            return
        if state.desired is not Desired.RUNNING or state.lifecycle not in LIVE_STATES:
            return
        why = f"controller lease expired: no controller heard for {silent_s:.1f} s"
        self.driver.stop(m.Stop(by="lease", reason=why))

    def _restart(self, by: str) -> Future[m.InstanceView]:
        """Stop (when anything is running), then start, on a helper thread."""
        stopped = self.driver.stop(m.Stop(by=by, reason="restart"))
        ref = self.actor_ref

        def then_start() -> m.InstanceView:
            stopped.result()
            view: m.InstanceView = ref.ask(m.Start(by=by), block=True)
            return view

        return self.in_thread(then_start)


def _make_driver(actor: InstanceActor) -> Driver:
    from .adopted_driver import AdoptedDriver  # noqa: PLC0415 - drivers import this module
    from .ollama_driver import OllamaDriver  # noqa: PLC0415
    from .process_driver import ProcessDriver  # noqa: PLC0415

    kinds: dict[str, Callable[[InstanceActor], Driver]] = {
        "process": ProcessDriver,
        "ollama": OllamaDriver,
        "adopted": AdoptedDriver,
    }
    return kinds[actor.adapter.kind](actor)


def _provisional(draft: EventDraft, seq: int) -> StoredEvent:
    """A stored-event stand-in used to check an event before it is appended."""
    return StoredEvent(
        seq=seq,
        ts_ns=draft.ts_ns,
        node="",
        source=draft.source,
        kind=draft.kind,
        subject=draft.subject,
        payload=draft.payload,
        payload_hash=b"\0" * 32,
        prev_hash=b"\0" * 32,
        hash=b"\0" * 32,
    )
