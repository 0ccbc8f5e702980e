"""An instance the chain has whose adapter cannot be built: still placed, still answering.

At boot (or when a dead instance actor is recreated) the host rebuilds each
instance's adapter from its recorded spec. That fails when the model is gone
from the registry or fails its digest check, or when the launcher program is
missing. Such an instance does not vanish: the host routes it to an
:class:`UnbuiltActor`, which

- answers ``status`` from the sourced state, its reason being the problem;
- refuses ``start`` and ``restart`` with :class:`~.errors.InvalidState` naming
  the problem and the fix, and records it as ``instance.start_refused`` (once
  per cause: a refusal whose reason is the one last recorded is not recorded
  again);
- allows ``stop`` and ``unload`` when nothing of it runs (recorded, decided by
  the same decision core as any instance); with a server process recorded it
  refuses them, since that process cannot be signalled without its adapter;
- tries to build the adapter again on every ``start`` and ``restart``: once the
  operator has fixed the problem (restored the model, installed the program)
  the instance is handed over to a normal instance actor (:class:`Handover`,
  answered by the host) and the verb goes on there. No node restart is needed.

Building the adapter may hash the model's weights: that runs on this actor's
thread, so it delays only this instance's verbs.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import msgspec
import pykka

from infervisor.adapters import planning
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.adapters.spec import Mode as SpecMode
from infervisor.chain import EventDraft, StoredEvent
from infervisor.replay import LIVE_STATES, InstanceState, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.policy import restarts_in_window

from . import messages as m
from .core import observations as o
from .core.common import STARTABLE
from .core.decide import decide
from .core.decision import Situation
from .core.rules import Mode, Rules, Tracking
from .errors import InvalidState
from .instance import InstanceContext, rules_for
from .stamps import now_stamp

__all__ = ["FIX_HINT", "Handover", "UnbuiltActor"]

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 60.0
#: What the operator can do about an instance whose adapter cannot be built.
FIX_HINT = (
    "fix that (put the model back in the registry with its recorded digest, or install "
    "the launcher program) and start it again, or unload it"
)


class Handover(msgspec.Struct, frozen=True):
    """To the host: the adapter of an unbuilt instance could be built; route the
    instance to a normal instance actor. ``answer`` gets that actor's ref."""

    instance_id: str
    state: InstanceState
    spec: InstanceSpec
    adapter: Any  # ServerAdapter (a Protocol: not a msgspec type)
    answer: Future[pykka.ActorRef[Any]]
    sender: Any  # the UnbuiltActor's ref: the host hands over only what it still routes


class UnbuiltActor(pykka.ThreadingActor):
    """Stands in for the instance actor of an instance whose adapter cannot be built."""

    def __init__(
        self,
        state: InstanceState,
        spec: InstanceSpec,
        problem: str,
        ctx: InstanceContext,
        *,
        registry: ModelRegistry,
        host: pykka.ActorRef[Any],
    ) -> None:
        super().__init__()
        self.state: InstanceState = state
        self.spec = spec
        self.problem = problem
        self.ctx = ctx
        self.registry = registry
        self.host = host
        self.iid = state.instance_id
        self.supervision = ctx.settings.supervision(spec.kind, spec.restart)
        self._recorded: str | None = None
        self._successor: pykka.ActorRef[Any] | None = None
        self._gone = False

    # ------------------------------------------------------------------ dispatch
    def on_receive(self, message: Any) -> Any:
        if self._successor is not None and _is_verb(message):
            return self._successor.ask(message, block=True, timeout=ASK_TIMEOUT_S)
        match message:
            case m.GetStatus():
                return self.view()
            case m.IsSettled():
                return True
            case m.Start(by=by):
                return self._start(by, restart=False)
            case m.Restart(by=by):
                return _future(lambda: self._start(by, restart=True))
            case m.Stop(by="shutdown"):
                return _future(self.view)  # nothing of it runs that could be stopped
            case m.Stop(by=by, grace_s=grace, reason=reason):
                grace = self.ctx.settings.stop_grace_s if grace is None else grace
                verb = o.StopVerb(by=by, grace_s=grace, reason=reason)
                return _future(lambda: self._decide(verb))
            case m.Unload(by=by):
                self._decide(o.UnloadVerb(by=by, grace_s=self.ctx.settings.stop_grace_s))
                return None
            case m.NewPlacement() | m.DeepHealth():
                raise InvalidState(self._refusal())
        return None  # ticks and boot: nothing of it runs

    # ------------------------------------------------------------------ verbs
    def _start(self, by: str, *, restart: bool) -> Any:
        if self._gone:
            raise InvalidState(f"{self.iid} is unloaded")
        try:
            adapter = planning.build_adapter(
                self.spec, self.iid, self.registry, self.ctx.settings.adapter_settings()
            )
        except AdapterError as e:
            self.problem = str(e)
            self._record_refusal(by)
            raise InvalidState(self._refusal()) from e
        successor = self._hand_over(adapter)
        view: m.InstanceView = successor.ask(m.GetStatus(), block=True, timeout=ASK_TIMEOUT_S)
        if view.lifecycle not in {s.value for s in STARTABLE}:
            return view  # its boot started it already (it was wanted running)
        if restart:
            done: Future[m.InstanceView] = successor.ask(
                m.Restart(by=by), block=True, timeout=ASK_TIMEOUT_S
            )
            return done.result(timeout=self.ctx.settings.stop_grace_s + 60)
        return successor.ask(m.Start(by=by), block=True, timeout=ASK_TIMEOUT_S)

    def _hand_over(self, adapter: ServerAdapter) -> pykka.ActorRef[Any]:
        answer: Future[pykka.ActorRef[Any]] = Future()
        msg = Handover(self.iid, self.state, self.spec, adapter, answer, self.actor_ref)
        self.host.tell(msg)
        successor = answer.result(timeout=ASK_TIMEOUT_S)
        self._successor = successor
        log.info("%s: its adapter could be built; it is supervised again", self.iid)
        return successor

    def _decide(self, verb: o.Observation) -> m.InstanceView | None:
        if self._gone:
            raise InvalidState(f"{self.iid} is unloaded")
        state = self.state
        running = state.process is not None or (
            self.spec.mode is not SpecMode.ADOPTED and state.lifecycle in LIVE_STATES
        )
        if running:
            pid = f" (pid {state.process.pid})" if state.process is not None else ""
            raise InvalidState(
                f"{self.iid} has a server recorded running{pid} but no adapter to end it: "
                f"{self.problem}; {FIX_HINT}"
            )
        now = now_stamp(self.ctx.clock)
        sit = Situation(state=state, tracking=Tracking(), rules=self._rules(), now=now)
        decision = decide(sit, verb)
        if decision.refusal is not None:
            raise InvalidState(decision.refusal.message)
        if decision.events:
            self._append(*decision.events, source=decision.source)  # one transaction
        return None if self._gone else self.view()

    # ------------------------------------------------------------------ recording
    def _record_refusal(self, by: str) -> None:
        """Record the problem as a refused start, unless it is the one last recorded."""
        if self._gone or self.problem == self._recorded:
            return
        if self._recorded is None and self.state.refusal == self.problem:
            self._recorded = self.problem
            return
        try:
            self._append(ev.StartRefused(by=by, reason=self.problem), source=by)
        except Exception:
            log.exception("%s: could not record why it cannot be started", self.iid)
            return
        self._recorded = self.problem

    def _append(self, *events: ev.InstanceEvent, source: str) -> None:
        """Append the events in one transaction (durable), then apply them."""
        ts_ns = self.ctx.clock.wall_ns()
        drafts = tuple(
            EventDraft(
                ts_ns=ts_ns,
                source=source,
                kind=kind_of(event),
                subject=self.iid,
                payload=ev.encode_event(event),
            )
            for event in events
        )
        stored: list[StoredEvent] = self.ctx.writer.ask(
            m.Append(drafts=drafts), block=True, timeout=ASK_TIMEOUT_S
        )
        state: InstanceState | None = self.state
        for record, event in zip(stored, events, strict=True):
            state = apply_instance(state, record, event)
        if state is None:
            self._gone = True
        else:
            self.state = state

    # ------------------------------------------------------------------ view
    def _refusal(self) -> str:
        return f"{self.iid} cannot be started: {self.problem}; {FIX_HINT}"

    def _rules(self) -> Rules:
        mode = Mode(_adapter_kind(self.spec))
        return rules_for(mode, self.spec, self.spec.model, self.ctx, self.supervision)

    def view(self) -> m.InstanceView:
        """The sourced state, with the problem as the reason."""
        state, spec = self.state, self.spec
        return m.InstanceView(
            instance_id=self.iid,
            adapter=f"infer.{spec.flavor.value}" + (".adopted" if _adopted(spec) else ""),
            placed_by=state.placed_by,
            generation=state.generation,
            role=spec.role,
            flavor=spec.flavor.value,
            mode=spec.mode.value,
            model=spec.model,
            endpoint=spec.base_url,
            lifecycle=state.lifecycle.value,
            desired=state.desired.value,
            reason=f"cannot be started: {self.problem}",
            since_ns=state.since_ns,
            pid=state.process.pid if state.process is not None else None,
            restarts=restarts_in_window(state, self.supervision.restart, now_stamp(self.ctx.clock)),
            health="",
            health_reason="",
            status="",
            status_detail=None,
            reserved_bytes=state.reserved_bytes,
            rss_bytes=None,
            exposure="loopback (managed)" if not _adopted(spec) else "unknown (not observed)",
            last_exit=state.last_exit,
            last_seq=state.last_seq,
            max_restarts=self.supervision.restart.max_restarts,
        )


#: The verbs a successor answers once the instance is handed over.
_VERBS = (
    m.GetStatus,
    m.IsSettled,
    m.Start,
    m.Restart,
    m.Stop,
    m.Unload,
    m.NewPlacement,
    m.DeepHealth,
)


def _is_verb(message: Any) -> bool:
    return isinstance(message, _VERBS)


def _future(fn: Any) -> Future[Any]:
    """``fn()``'s outcome in a done Future (verbs the node waits on answer Futures)."""
    done: Future[Any] = Future()
    try:
        done.set_result(fn())
    except Exception as e:  # noqa: BLE001 - the verb's answer
        done.set_exception(e)
    return done


def _adopted(spec: InstanceSpec) -> bool:
    return spec.mode is SpecMode.ADOPTED


def _adapter_kind(spec: InstanceSpec) -> str:
    if _adopted(spec):
        return "adopted"
    return "ollama" if spec.flavor is Flavor.OLLAMA else "process"
