"""The instance actor: one per instance, sole owner of its server and state,
and the executor of the decision core.

Every message becomes an observation for :func:`~.core.decide.decide`; the
decision's events are appended in one transaction through the node's chain
append (:mod:`.append`; durable) and applied with the same reducer replay
uses, and only then are its effects run (:mod:`.effects_runner`). A failed
append runs no effect: the state stays what the chain says, waiters get the
error, status shows the fault, and the observation from the world (an exit, a
probe, a timer) waits at the head of an ordered backlog (:mod:`.backlog`)
with every later one, undecided, until the chain takes writes again: nothing
is decided from state the chain has not recorded. Slow work never runs on the
actor's thread (probes and deep checks, sent when the core's pacing says:
:mod:`.health_checks`; reaping, Ollama loads and unloads on threads of their
own), so a hung server never holds up ``status``. The probes are scheduled by
the instance's probe engine (:mod:`.probe_loop`), which wakes this actor only
when the core says a report has something to decide. An instance whose adapter
cannot be built runs here too, with a stand-in adapter whose start check
refuses until a start can build it (:mod:`.stand_in`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgspec
import pykka

from infervisor.adapters.probe import ProbeTarget
from infervisor.adapters.prober import Prober
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.proc.table import ProcessTable
from infervisor.adapters.server import ServerAdapter
from infervisor.replay import InstanceState, LifecycleState, apply_instance
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import Stamp
from infervisor.replay.views import InstanceView

from . import messages as m
from . import verb_answers as answers
from .backlog import Backlog
from .boot_facts import boot_seen, owned_beyond
from .context import InstanceContext, rules_for
from .core import observations as o
from .core.common import STARTABLE
from .core.decide import decide
from .core.decision import Decision, Situation
from .core.effects import Timer
from .core.residency import holder
from .core.rules import Mode, Rules, Tracking
from .core.unbuilt import refuse_start, start_refusal, stop_refusal
from .effects_runner import EffectRunner, TimerFired
from .errors import InvalidState, RecordFailed
from .health_checks import HealthChecks, Probed, miss
from .ledger import Reservation
from .probe_loop import ProbeLoop
from .reconcile_facts import listener_ports, tree_rss_seen
from .stamps import now_stamp
from .stand_in import UnbuiltServer
from .view import build_view, post_of

__all__ = ["InstanceActor", "tell"]

log = logging.getLogger(__name__)
S = LifecycleState


class _Retry(msgspec.Struct, frozen=True):
    """Time to try the backlog's head again."""


#: Observations the effects' threads report, decided as they come.
_AS_REPORTED = (
    o.ProcessExited, o.GroupGone, o.OllamaResidency, o.OllamaLoadEnded, o.OllamaUnloadEnded,
    o.RequestBegan, o.RequestEnded, o.ServerActivity,
)  # fmt: skip


def tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell, ignoring an actor that has already stopped (late timers and threads)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


class InstanceActor(pykka.ThreadingActor):
    """Owns one instance. Answers verbs; acts on ticks and on its own observations.

    ``adapter`` is an :class:`~.stand_in.UnbuiltServer` while the instance's
    adapter cannot be built: its start check refuses until a rebuild works.
    """

    # A daemon thread: CPython keeps a lock per non-daemon thread and scans them
    # all on every thread start, so starting a thousand instances cost O(n^2).
    # The node stops every instance actor itself (Node.shutdown).
    use_daemon_thread = True

    def __init__(self, state: InstanceState, adapter: ServerAdapter, ctx: InstanceContext) -> None:
        super().__init__()
        self.state: InstanceState = state
        self.ctx = ctx
        self.iid = state.instance_id
        spec = adapter.spec
        self.supervision = ctx.settings.supervision(spec.kind, spec.restart)
        self.tracking = Tracking()
        #: Missed probes since this actor began (ever-increasing: the metrics' counter).
        self.missed_probes = 0
        self.effects = EffectRunner(self)
        self.checks = HealthChecks(self)
        self.probes: ProbeLoop = self.checks.loop  # the last probe's report and latency
        self._take_adapter(adapter)
        #: The last socket-table snapshot (for status' exposure of adopted servers).
        self.listeners: dict[int, list[str]] | None = None
        # (pid, RSS of its tree in bytes) at the last reconcile tick that saw it.
        self.rss_seen: tuple[int, int] | None = None
        self.fault = ""
        self._gone = False
        self._closing = False
        self._waiters = answers.Waiters()
        self.backlog = Backlog()
        self._post()

    def _take_adapter(self, adapter: ServerAdapter) -> None:
        """Drive the server through ``adapter`` (at start, and once an unbuilt one is built)."""
        self.adapter = adapter
        self.rules = rules_for(
            Mode(adapter.kind), adapter.spec, adapter.served_model, self.ctx, self.supervision
        )
        self.memory = Reservation(self.ctx.ledger, self.iid, adapter.model_bytes)

    # ------------------------------------------------------------------ dispatch
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, m.GetStatus):
            return self.view()
        if isinstance(message, m.IsSettled):
            return self._settled()
        try:
            return self._receive(message)
        finally:
            self._post()  # what it changed (listeners, the fault, an adapter built) is seen

    def _receive(self, message: Any) -> Any:
        if self._gone:
            if isinstance(message, (m.Start, m.Stop, m.Restart, m.Unload)):
                raise InvalidState(f"{self.iid} is unloaded")
            return None
        verb = self._verb(message)
        if verb is not None or isinstance(self.adapter, UnbuiltServer):
            return verb  # nothing of an unbuilt instance runs that ticks could observe
        try:
            self._observe(message)
        except Exception as e:
            # A handler that raises must not end the actor: the instance keeps its server.
            log.exception("%s: error handling %r", self.iid, message)
            if isinstance(message, Probed):
                with contextlib.suppress(Exception):
                    self.run(miss(message.token, e))
        return None

    def _verb(self, message: Any) -> Any:
        s = self.ctx.settings
        match message:
            case m.Start(by=by, room=room):
                self._decide_verb(o.StartVerb(by=by, room=room))
                return self.view()
            case m.Stop(by=by, grace_s=grace, reason=reason):
                if by == Role.SHUTDOWN:
                    self._closing = True
                grace = s.stop_grace_s if grace is None else grace
                return self._await(o.StopVerb(by=by, grace_s=grace, reason=reason), answers.stopped)
            case m.Restart(by=by, room=room):
                restart = o.RestartVerb(by=by, grace_s=s.stop_grace_s, room=room)
                return self._await(restart, answers.restarted)
            case m.Unload(by=by):
                verb = o.UnloadVerb(by=by, grace_s=s.stop_grace_s)
                return self._await(verb, lambda st, _r: st is None)
            case m.NewPlacement(placed_by=placed_by, generation=generation, by=by):
                placement = o.PlacementVerb(placed_by=placed_by, generation=generation, by=by)
                decision = self._decide_verb(placement)
                return decision is not None and any(
                    isinstance(e, ev.Replaced) for e in decision.events
                )
            case m.DeepHealth():
                return self.checks.deep_health_verb()
        return self._residency_verb(message)

    def _residency_verb(self, message: Any) -> Any:
        """The node's residency asks (actors/node_residency.py); None for anything else."""
        match message:
            case o.DemandVerb():
                return self._await(message, lambda st, _r: answers.demand_settled(st))
            case m.AwaitReady():
                return self._await_state(answers.demand_settled)
            case m.AwaitStopped():
                return self._await_state(lambda st: answers.stopped(st, self.rules))
            case o.EvictVerb():
                return self._await(message, answers.stopped)
            case o.RoomRefused() | o.RoomPlanned() | o.StartAgain():
                self._decide_verb(message)
                return self.view()
            case m.ResidencyFacts(sizing=sizing):
                size = self.effects.start_bytes() if sizing else self.adapter.model_bytes
                return holder(self.state, self.rules, self.tracking.serving, size)
        return None

    def _observe(self, message: Any) -> None:
        if isinstance(message, _AS_REPORTED):
            self.run(message)
            return
        match message:
            case m.HealthTick():
                if not self.backlog:  # no new verdict on a state the chain has not recorded
                    self.checks.tick()
            case o.DeepChecked():
                self.checks.deep_checked()
                self.run(message)
            case Probed():
                for obs in self.checks.probed(message):
                    self.run(obs)
            case m.ReconcileTick(listeners=listeners, processes=processes):
                self._reconcile(listeners, processes)
            case m.Boot(held=held):
                self.run(boot_seen(self.adapter, self.state, self.effects, held=held))
            case m.LeaseExpired(silent_s=silent, controller=controller):
                self.run(o.LeaseLapsed(silent_s=silent, controller=controller))
            case TimerFired(name=name, gen=gen):
                # A node shutting down starts nothing again, but still ends what it stops.
                current = self.effects.timer_current(name, gen)
                if current and (name == Timer.KILL or not self._closing):
                    self.run(o.TimerDue(name=name))
            case _Retry():
                self._drain()

    def on_stop(self) -> None:
        self.ctx.views.drop(self.iid, self)
        self.effects.close()
        self.checks.close()
        self.adapter.close()
        if self.ctx.engine is not None:
            self.ctx.engine.forget(self.iid)

    # ------------------------------------------------------------------ deciding
    def now(self) -> Stamp:
        """Now, on both clocks."""
        return now_stamp(self.ctx.clock)

    def run(self, observation: o.Observation) -> Decision | None:
        """Decide on one observation and execute it, then on every observation
        its effects produce at once. Returns the first decision, or None when
        nothing was decided: the chain refused its events, or observations are
        waiting for the chain (then a verb is refused, anything else waits its
        turn in the backlog)."""
        if self.backlog:
            if not answers.is_verb(observation):
                self.backlog.hold(observation)
                self.fault = self.backlog.fault()
            return None
        first = self._execute(deque([observation]))
        if not self.backlog:
            self.backlog.recovered()  # nothing waits: the next refusal is news (logged)
        self._after_run()
        return first

    def _execute(self, queue: deque[o.Observation]) -> Decision | None:
        """Decide, record and act on each observation of ``queue`` in turn. On a
        refused append that observation (unless a verb: its caller is told) and
        the rest wait at the head of the backlog, and a retry is armed."""
        first: Decision | None = None
        while queue and not self._gone:
            obs = queue.popleft()
            sit = Situation(
                state=self.state, tracking=self.tracking, rules=self.rules, now=self.now()
            )
            decision = self._record_decision(decide(sit, obs), obs, sit.now)
            if decision is None:
                if not answers.is_verb(obs):
                    self.backlog.put_back([obs, *queue])
                    self._arm_retry()
                return first
            first = first or decision
            if decision.refusal is not None and first.refusal is None:
                first = msgspec.structs.replace(first, refusal=decision.refusal)
            for effect in decision.effects:
                follow = self.effects.run(effect)
                if follow is not None:
                    queue.append(follow)
        return first

    def _record_decision(
        self, decision: Decision, obs: o.Observation, now: Stamp
    ) -> Decision | None:
        """Record the decision on ``obs``: its events appended (durable) and
        applied. None when the chain refused them (nothing of the decision is
        kept, not even its tracking)."""
        if decision.events:
            try:
                self._record(decision, now)
            except Exception as e:  # noqa: BLE001 - any append failure: nothing is acted on
                self._append_failed(obs, e)
                return None
        if decision.tracking is not None:
            self.missed_probes += max(0, decision.tracking.misses - self.tracking.misses)
            self.tracking = decision.tracking
        self._waiters.fail_on(decision.refusal, verb=answers.is_verb(obs), iid=self.iid)
        return decision

    def _record(self, decision: Decision, now: Stamp) -> None:
        """Append the decision's events in one transaction, then apply them.

        The append is waited on without a limit: one the writer still holds may
        yet commit, and a decision taken again after it did would be recorded twice.
        """
        stored = self.ctx.chain.append(
            decision.events, source=decision.source, subject=self.iid, ts_ns=now.wall_ns,
            timeout_s=None,
        )  # fmt: skip
        state: InstanceState | None = self.state
        for record, event in zip(stored, decision.events, strict=True):
            state = apply_instance(state, record, event)
        self.fault = ""
        if state is None:
            self._gone = True
            self.memory.give_back()
            self.ctx.gone(self.iid)
        else:
            self.state = state

    def _append_failed(self, obs: o.Observation, error: Exception) -> None:
        why = f"the chain could not record a decision ({type(error).__name__}: {error})"
        if self.backlog.failed(why):
            log.error("%s: %s", self.iid, why)  # once per kind of error, not per retry
        self.fault = why
        self._waiters.fail_all(lambda: RecordFailed(f"{self.iid}: {why}; nothing was done"))
        if answers.is_verb(obs):
            raise RecordFailed(f"{self.iid}: {why}; nothing was done")

    # ------------------------------------------------------------------ the backlog
    def _arm_retry(self) -> None:
        """Try the backlog's head again after the next backoff (capped, no limit)."""
        self.fault = self.backlog.fault()
        delay = self.backlog.next_delay()
        if delay is not None:
            self.ctx.clock.call_later(delay, lambda: self.tell_self(_Retry()))

    def _drain(self) -> None:
        """Decide the waiting observations in order, each with whatever its effects
        produce at once, until none waits or the chain refuses again."""
        self.backlog.retry_due()
        while self.backlog and not self._gone and not self.backlog.armed:
            self._execute(deque([self.backlog.take()]))
        if not self.backlog:
            self._recovered()
        self._after_run()

    def _recovered(self) -> None:
        """The chain took everything that waited: clear the fault; probe afresh
        (a probe is due at once: what was observed meanwhile is no verdict)."""
        if self.backlog.recovered():
            log.warning("%s: the chain records again; no observation waits", self.iid)
        self.fault = ""
        self.checks.afresh()

    def _after_run(self) -> None:
        if self._gone:
            self.effects.close()
            self.checks.close()  # nothing left to probe
        else:
            self.memory.sync(self.state.reserved_bytes)
            self.checks.decided(recording=not self.backlog)
        self._post()  # before any waiter is answered: a caller reads what it waited for
        self._waiters.resolve(None if self._gone else self.state)

    # ------------------------------------------------------------------ verbs
    def _decide_verb(self, verb: o.Observation) -> Decision | None:
        """Decide on a verb; its decision (None: nothing to decide, answer as is).

        Raises:
            The refusal's error; RecordFailed: the chain refused the events.
        """
        gated = self._unbuilt_gate(verb)
        if gated is None:
            return None
        decision = self.run(gated)
        if decision is None:
            raise RecordFailed(f"{self.iid}: {self.fault}; nothing was done")
        if decision.refusal is not None:
            raise answers.refusal_error(decision.refusal)
        return decision

    def _await(
        self, verb: o.Observation, done: Callable[[InstanceState | None, Rules], bool]
    ) -> Future[Any]:
        """Decide on a verb; answer a Future resolved once ``done`` holds."""
        future: Future[Any] = Future()
        try:
            decided = self._decide_verb(verb)
        except Exception as e:  # noqa: BLE001 - the refusal is the verb's answer
            future.set_exception(e)
            return future
        if decided is None:
            future.set_result(self._answer())
            return future
        waiter = answers.Waiter(lambda st: done(st, self.rules), future, self._answer)
        self._waiters.add(waiter, None if self._gone else self.state)
        return future

    def _answer(self) -> Any:
        return None if self._gone else self.view()

    def _await_state(self, done: Callable[[InstanceState | None], bool]) -> Future[Any]:
        """A Future answered with the view once ``done`` holds (at once when it does)."""
        future: Future[Any] = Future()
        self._waiters.add(answers.Waiter(done, future, self._answer), self.state)
        return future

    # ------------------------------------------------------------------ unbuilt
    def _unbuilt_gate(self, verb: o.Observation) -> o.Observation | None:
        """While the adapter cannot be built (see :mod:`.stand_in`): a start first
        tries to build it; the core refuses what cannot be done without it. The
        verb to decide once the gate is passed (None: nothing to decide).

        Raises:
            InvalidState: refused; RecordFailed: the refusal could not be recorded.
        """
        stand_in = self.adapter
        if not isinstance(stand_in, UnbuiltServer):
            return verb
        if isinstance(verb, o.StartVerb | o.RestartVerb):
            return self._rebuild(stand_in, verb)
        if not isinstance(verb, o.StopVerb | o.UnloadVerb):
            raise answers.refusal_error(start_refusal(self.state, stand_in.problem))
        refusal = stop_refusal(self.state, self.rules, stand_in.problem)
        if refusal is None:
            return verb
        if isinstance(verb, o.StopVerb) and verb.by == Role.SHUTDOWN:
            return None  # nothing of it could be stopped: the chain stays as it says
        raise answers.refusal_error(refusal)

    def _rebuild(self, stand_in: UnbuiltServer, verb: o.StartVerb | o.RestartVerb) -> o.Observation:
        """Build the adapter again: take it and see the server as a boot does, or
        record the refusal (once per cause) and raise it."""
        try:
            adapter = stand_in.rebuild()
        except AdapterError:
            decision = refuse_start(self.state, stand_in.problem, verb.by)
            self._record_decision(decision, verb, self.now())  # RecordFailed when refused
            self._after_run()
            raise answers.refusal_error(start_refusal(self.state, stand_in.problem)) from None
        self._take_adapter(adapter)
        stand_in.built(self.actor_ref)
        self.run(boot_seen(adapter, self.state, self.effects))
        if isinstance(verb, o.RestartVerb) and self.state.lifecycle not in STARTABLE:
            return o.StartVerb(by=verb.by, room=verb.room)  # its boot started it: no restart
        return verb

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self, listeners: Any, processes: ProcessTable | None) -> None:
        if self._closing:
            return
        self.rss_seen = tree_rss_seen(self.effects.proc, processes, self.rss_seen)
        if listeners is not None:
            self.listeners = listener_ports(listeners)
            owned = owned_beyond(self.adapter, self.state, self.effects, listeners)
            if owned:
                self.run(o.ListenersSeen(owned_beyond=owned))
        self.run(o.Tick())

    # ------------------------------------------------------------------ helpers
    def tell_self(self, message: Any) -> None:
        """Send this actor a message (from any thread)."""
        tell(self.actor_ref, message)

    @property
    def prober(self) -> Prober:
        """The node's prober (the probes seam, adapters/prober.py)."""
        return self.checks.prober

    def probe_target(self, timeout_s: float | None = None) -> ProbeTarget:
        """This instance's server, each request within ``timeout_s`` seconds."""
        return self.checks.target(timeout_s)

    def _settled(self) -> bool:
        state = self.state
        busy = state.terminating is not None or state.lifecycle is S.STOPPING
        probing = self.checks.probing
        return not probing and self.effects.inflight == 0 and not (busy and not self._gone)

    def view(self) -> InstanceView:
        """This instance's status view (never probes)."""
        return build_view(self)

    def _post(self) -> None:
        """Post the view for ``list`` (:mod:`.view_board`); never ahead of the chain."""
        self.ctx.views.post(self.iid, post_of(self))
