"""The instance actor: one per instance, sole owner of its server and state,
and the executor of the decision core.

Every message becomes an observation for :func:`~.core.decide.decide`; the
decision's events are appended in one transaction (durable) and applied with
the same reducer replay uses, and only then are its effects run. A failed
append runs no effect: the state stays what the chain says, waiters get the
error, status shows the fault, and the observation from the world (an exit, a
probe, a timer) waits at the head of an ordered backlog (:mod:`.backlog`)
with every later one, undecided, until the chain takes writes again: nothing
is decided from state the chain has not recorded. Slow work never
runs on the actor's thread (probes on the node's probe pool; reaping, Ollama
loads and unloads on threads of their own), so a hung server never holds up
``status``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec
import pykka

from infervisor.adapters.cgroups import Containment, no_containment
from infervisor.adapters.ports import ListenerSnapshot
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.probe_engine import ProbeEngine
from infervisor.adapters.proc_table import ProcessTable
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.spec import InstanceSpec
from infervisor.chain import EventDraft, StoredEvent
from infervisor.replay import InstanceState, LifecycleState, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import Stamp

from . import messages as m
from . import verb_answers as answers
from .backlog import Backlog
from .boot_facts import boot_seen, owned_beyond
from .clock import Clock
from .core import observations as o
from .core.decide import decide
from .core.decision import Decision, Refusal, RefusalKind, Situation
from .core.effects import Timer
from .core.health import probe_token, wants_deep, wants_probe
from .core.rules import Mode, Rules, Tracking
from .core.supervision import Supervision
from .effects_runner import EffectRunner, TimerFired
from .errors import InvalidState, RecordFailed, VerbFailed
from .ledger import Reservation
from .settings import NodeSettings
from .stamps import now_stamp
from .view import build_view

__all__ = ["InstanceActor", "InstanceContext", "TimerFired", "tell"]

log = logging.getLogger(__name__)
S = LifecycleState

#: Probe workers for contexts built without a node (tests); a node passes its own pool.
_SHARED_FALLBACK = ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")
#: Seconds after which an append the writer has not answered is logged (and waited on).
APPEND_WARN_S = 60.0


@dataclass(frozen=True)
class InstanceContext:
    """What every instance actor of a node shares (read-only).

    ``ledger`` is the residency ledger actor, or None when the node has no
    memory budget. ``engine`` makes the plain HTTP probes of every instance on
    one event loop (each with its own timeout: a hung server delays no other
    probe); ``probes`` runs the others (an adapter whose probe does more than
    HTTP, or a node without an engine).
    """

    node_id: str
    writer: pykka.ActorRef[Any]
    clock: Clock
    settings: NodeSettings
    ledger: pykka.ActorRef[Any] | None = None
    probes: Executor = field(default_factory=lambda: _SHARED_FALLBACK)
    engine: ProbeEngine | None = None
    #: Told the instance id when a decision of the instance's own unloaded it (a
    #: boot finishing an unload the last node began): the host forgets it then.
    gone: Callable[[str], None] = field(default=lambda _iid: None)
    #: How managed servers are contained (cgroups, or process groups only).
    containment: Containment = field(default_factory=no_containment)


class _Probed(msgspec.Struct, frozen=True):
    token: int
    report: ServerReport
    latency_s: float  # from sending the probe to its report, seconds


class _Retry(msgspec.Struct, frozen=True):
    """Time to try the backlog's head again."""


def tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell, ignoring an actor that has already stopped (late timers and threads)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


class InstanceActor(pykka.ThreadingActor):
    """Owns one instance. Answers verbs; acts on ticks and on its own observations."""

    # A daemon thread: CPython keeps a lock per non-daemon thread and scans them
    # all on every thread start, so starting a thousand instances cost O(n^2).
    # The node stops every instance actor itself (Node.shutdown).
    use_daemon_thread = True

    def __init__(self, state: InstanceState, adapter: ServerAdapter, ctx: InstanceContext) -> None:
        super().__init__()
        self.state: InstanceState = state
        self.adapter = adapter
        self.ctx = ctx
        self.iid = state.instance_id
        spec = adapter.spec
        self.supervision = ctx.settings.supervision(spec.kind, spec.restart)
        self.rules = rules_for(
            Mode(adapter.kind), spec, adapter.served_model, ctx, self.supervision
        )
        self.tracking = Tracking()
        self.memory = Reservation(ctx.ledger, state.instance_id, adapter.model_bytes)
        self.effects = EffectRunner(self)
        self.report: ServerReport | None = None
        #: The last socket-table snapshot (for status' exposure of adopted servers).
        self.listeners: dict[int, list[str]] | None = None
        # (pid, RSS of its tree in bytes) at the last reconcile tick that saw it.
        self.rss_seen: tuple[int, int] | None = None
        self.fault = ""
        #: How long the last probe took, seconds (real time; None before the first).
        self.probe_latency_s: float | None = None
        self._gone = False
        self._closing = False
        self._probing = False
        self._last_probe_at: float | None = None
        self._deep_running = False
        self._last_deep_at: float | None = None
        self._waiters: list[answers.Waiter] = []
        self.backlog = Backlog()

    # ------------------------------------------------------------------ dispatch
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, m.GetStatus):
            return self.view()
        if isinstance(message, m.IsSettled):
            return self._settled()
        if self._gone:
            if isinstance(message, (m.Start, m.Stop, m.Restart, m.Unload)):
                raise InvalidState(f"{self.iid} is unloaded")
            return None
        verb = self._verb(message)
        if verb is not None:
            return verb
        try:
            self._observe(message)
        except Exception as e:
            # A handler that raises must not end the actor: the instance keeps its server.
            log.exception("%s: error handling %r", self.iid, message)
            if isinstance(message, _Probed):
                self._count_as_miss(message.token, e)
        return None

    def _verb(self, message: Any) -> Any:
        s = self.ctx.settings
        match message:
            case m.Start(by=by):
                self._decide_verb(o.StartVerb(by=by))
                return self.view()
            case m.Stop(by=by, grace_s=grace, reason=reason):
                if by == Role.SHUTDOWN:
                    self._closing = True
                grace = s.stop_grace_s if grace is None else grace
                return self._await(o.StopVerb(by=by, grace_s=grace, reason=reason), answers.stopped)
            case m.Restart(by=by):
                return self._await(o.RestartVerb(by=by, grace_s=s.stop_grace_s), answers.restarted)
            case m.Unload(by=by):
                verb = o.UnloadVerb(by=by, grace_s=s.stop_grace_s)
                return self._await(verb, lambda st, _r: st is None)
            case m.NewPlacement(placed_by=placed_by, generation=generation, by=by):
                decision = self._decide_verb(
                    o.PlacementVerb(placed_by=placed_by, generation=generation, by=by)
                )
                return any(isinstance(e, ev.Replaced) for e in decision.events)
            case m.DeepHealth():
                return self._in_thread(self.adapter.deep_health)
        return None

    def _observe(self, message: Any) -> None:
        match message:
            case m.HealthTick():
                self._health_tick()
            case o.DeepChecked():
                self._deep_running = False
                self.run(message)
            case _Probed(token=token, report=report, latency_s=latency_s):
                self._probing = False
                self.report = report
                self.probe_latency_s = latency_s
                # The output is read for a failure line only while starting (the core
                # judges it only then); decoding its tails on every probe costs.
                starting = self.state.lifecycle is S.STARTING
                failure = self._failure() if starting else None
                self.run(o.ProbeResult(token=token, report=report, failure=failure))
                listed = self._ollama_listed(report)
                if listed is not None:
                    self.run(listed)
            case m.ReconcileTick(listeners=listeners, processes=processes):
                self._reconcile(listeners, processes)
            case m.Boot():
                self.run(boot_seen(self.adapter, self.state, self.effects))
            case m.LeaseExpired(silent_s=silent):
                self.run(o.LeaseLapsed(silent_s=silent))
            case TimerFired(name=name, gen=gen):
                # A node shutting down starts nothing again, but still ends what it stops.
                current = self.effects.timer_current(name, gen)
                if current and (name == Timer.KILL or not self._closing):
                    self.run(o.TimerDue(name=name))
            case _Retry():
                self._drain()
            case o.ProcessExited() | o.GroupGone() | o.OllamaResidency() | o.OllamaLoadEnded():
                self.run(message)
            case o.OllamaUnloadEnded():
                self.run(message)

    def on_stop(self) -> None:
        self.effects.close()
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
            decision = self._decide_and_record(obs)
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

    def _decide_and_record(self, obs: o.Observation) -> Decision | None:
        """Decide on ``obs`` from sourced state; record its events. None when the
        chain refused them (nothing of the decision is kept, not even its tracking)."""
        sit = Situation(state=self.state, tracking=self.tracking, rules=self.rules, now=self.now())
        decision = decide(sit, obs)
        if decision.events:
            try:
                self._record(decision, sit.now)
            except Exception as e:  # noqa: BLE001 - any append failure: nothing is acted on
                self._append_failed(obs, e)
                return None
        if decision.tracking is not None:
            self.tracking = decision.tracking
        self._fail_waiters_on(decision.refusal, verb=answers.is_verb(obs))
        return decision

    def _record(self, decision: Decision, now: Stamp) -> None:
        """Append the decision's events in one transaction, then apply them."""
        drafts = tuple(
            EventDraft(
                ts_ns=now.wall_ns,
                source=decision.source,
                kind=kind_of(event),
                subject=self.iid,
                payload=ev.encode_event(event),
            )
            for event in decision.events
        )
        stored = self._durable(self.ctx.writer.ask(m.Append(drafts=drafts), block=False))
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

    def _durable(self, answer: pykka.Future[list[StoredEvent]]) -> list[StoredEvent]:
        """The writer's answer to an append: the stored events, or its error.

        Never given up on after a timeout: an append the writer still holds may
        yet commit, and a decision taken again after it did would be recorded
        twice (and the live state would miss the first). A writer's transaction
        waits at most ``BUSY_TIMEOUT_S`` for the lock; this warns after
        :data:`APPEND_WARN_S` and waits on. A writer that stops fails the ask
        (``ActorDeadError``).
        """
        try:
            return answer.get(timeout=APPEND_WARN_S)
        except pykka.Timeout:
            log.warning(
                "%s: the chain writer has not answered an append for %g s; waiting on",
                self.iid, APPEND_WARN_S,
            )  # fmt: skip
            return answer.get()

    def _append_failed(self, obs: o.Observation, error: Exception) -> None:
        why = f"the chain could not record a decision ({type(error).__name__}: {error})"
        if self.backlog.failed(why):
            log.error("%s: %s", self.iid, why)  # once per kind of error, not per retry
        self.fault = why
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(RecordFailed(f"{self.iid}: {why}; nothing was done"))
        self._waiters.clear()
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
        self._last_probe_at = None
        self._last_deep_at = None

    def _after_run(self) -> None:
        if self._gone:
            self.effects.close()
        else:
            self.memory.sync(self.state.reserved_bytes)
        self._resolve_waiters()

    # ------------------------------------------------------------------ verbs
    def _decide_verb(self, verb: o.Observation) -> Decision:
        decision = self.run(verb)
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
            self._decide_verb(verb)
        except Exception as e:  # noqa: BLE001 - the refusal is the verb's answer
            future.set_exception(e)
            return future
        self._waiters.append(answers.Waiter(lambda st: done(st, self.rules), future, self._answer))
        self._resolve_waiters()
        return future

    def _answer(self) -> Any:
        return None if self._gone else self.view()

    def _resolve_waiters(self) -> None:
        state = None if self._gone else self.state
        for waiter in list(self._waiters):
            if waiter.future.done():
                self._waiters.remove(waiter)
            elif waiter.done(state):
                self._waiters.remove(waiter)
                waiter.future.set_result(waiter.answer())

    def _fail_waiters_on(self, refusal: Refusal | None, *, verb: bool) -> None:
        if refusal is None or verb or refusal.kind is not RefusalKind.FAILED:
            return
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(VerbFailed(f"{self.iid}: {refusal.message}"))
        self._waiters.clear()

    # ------------------------------------------------------------------ ticks
    def _health_tick(self) -> None:
        if self.backlog:
            return  # no new verdict on a state the chain has not recorded (see .backlog)
        self._deep_tick()
        if self._probing or not wants_probe(self.state, self.rules):
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
        token, engine = probe_token(self.state), self.ctx.engine
        if engine is not None and getattr(self.adapter, "plain_probe", False):
            spec = self.adapter.spec
            timeout = self.ctx.settings.probe_timeout_s
            deliver = partial(self._probed_by_engine, token, time.perf_counter())
            engine.probe(self.iid, spec.base_url, spec.flavor, timeout, deliver)
        else:
            self.ctx.probes.submit(self._probe_job, token)

    def _probed_by_engine(self, token: int, sent: float, report: ServerReport) -> None:
        """On the engine's thread: hand the report (and its latency) to the actor."""
        latency = time.perf_counter() - sent
        self.tell_self(_Probed(token=token, report=report, latency_s=latency))

    def _deep_tick(self) -> None:
        """Start a deep health check (one real token) when the kind's
        ``deep_interval_s`` has passed since the last one began. It runs on a
        thread of its own (a completion can take up to ``deep_timeout_s``), one
        at a time, and reports :class:`~.core.observations.DeepChecked`."""
        if self._deep_running or not wants_deep(self.state, self.rules):
            return
        now = self.ctx.clock.monotonic()
        last = self._last_deep_at
        slack = self.ctx.settings.tick_s / 2
        if last is not None and now - last < self.supervision.deep_interval_s - slack:
            return
        self._last_deep_at = now
        self._deep_running = True
        token = probe_token(self.state)

        def check() -> None:
            try:
                self.adapter.deep_health()
                error: str | None = None
            except Exception as e:  # noqa: BLE001 - every failure is the check's verdict
                error = str(e) or type(e).__name__
            self.tell_self(o.DeepChecked(token=token, error=error))

        threading.Thread(target=check, name=f"{self.iid[:12]}-deep", daemon=True).start()

    def _probe_job(self, token: int) -> None:
        """On a probe worker: always answer, so a probe that raises is a miss, never a
        probe that never ends."""
        sent = time.perf_counter()
        try:
            report = self.adapter.probe()
        except Exception as e:  # noqa: BLE001 - reported as the probe's verdict
            why = f"probe error: {type(e).__name__}: {e}"
            report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
        self.tell_self(_Probed(token=token, report=report, latency_s=time.perf_counter() - sent))

    def _ollama_listed(self, report: ServerReport) -> o.OllamaListed | None:
        """Managed Ollama: what ``/api/ps`` said of this model, when it gave a list."""
        if self.rules.mode is not Mode.OLLAMA or report.running is None:
            return None
        if report.health.kind is not HealthKind.UP:
            return None
        entry = report.running_model(self.rules.served_model or "")
        if entry is None:
            return o.OllamaListed(listed=False)
        return o.OllamaListed(
            listed=True,
            size_bytes=entry.size_bytes,
            size_vram_bytes=entry.size_vram_bytes,
            expires_at_ns=entry.expires_at_ns,
        )

    def _count_as_miss(self, token: int, error: Exception) -> None:
        """A probe whose handling raised counts as a miss, with the error as its reason."""
        why = f"handler error: {type(error).__name__}: {error}"
        report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
        with contextlib.suppress(Exception):
            self.run(o.ProbeResult(token=token, report=report))

    def _failure(self) -> str | None:
        """A line of the server's output saying it will never serve."""
        proc, adapter = self.effects.proc, self.adapter
        find = getattr(adapter, "failure_in_output", None)
        if proc is None or find is None:
            return None
        out, err = proc.output()
        found: str | None = find(out[-8192:] + "\n" + err[-8192:])
        return found

    def _reconcile(self, listeners: Any, processes: ProcessTable | None) -> None:
        if self._closing:
            return
        self._observe_processes(processes)
        self._check_exposure(listeners)
        self.run(o.Tick())

    def _observe_processes(self, table: ProcessTable | None) -> None:
        """Track the server's descendants and note its tree's RSS from the tick's
        one process-table read (status reports that; it never scans itself)."""
        proc = self.effects.proc
        if table is None or proc is None:
            return
        proc.track_descendants(table)
        pid = proc.identity.pid
        rss = table.tree_rss_bytes(pid)
        self.rss_seen = None if rss is None else (pid, rss)

    def _check_exposure(self, listeners: Any) -> None:
        """Our own server listening beyond loopback is an observation (the snapshot
        is the node's one socket-table read of this tick)."""
        if listeners is None or self._closing:
            return
        self.listeners = listeners.ports() if isinstance(listeners, ListenerSnapshot) else listeners
        owned = owned_beyond(self.adapter, self.state, self.effects, listeners)
        if owned:
            self.run(o.ListenersSeen(owned_beyond=owned))

    # ------------------------------------------------------------------ helpers
    def tell_self(self, message: Any) -> None:
        """Send this actor a message (from any thread)."""
        tell(self.actor_ref, message)

    def _in_thread(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on its own daemon thread; its result or error lands in the Future."""
        done: Future[Any] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except Exception as e:  # noqa: BLE001 - handed to whoever waits on the Future
                done.set_exception(e)

        threading.Thread(target=run, name=f"{self.iid[:12]}-work", daemon=True).start()
        return done

    def _settled(self) -> bool:
        state = self.state
        busy = state.terminating is not None or state.lifecycle is S.STOPPING
        return not self._probing and self.effects.inflight == 0 and not (busy and not self._gone)

    def view(self) -> m.InstanceView:
        """This instance's status view (never probes)."""
        return build_view(self)


def rules_for(
    mode: Mode, spec: InstanceSpec, served_model: str | None, ctx: InstanceContext,
    supervision: Supervision,
) -> Rules:  # fmt: skip
    """An instance's rules for the decision core, from its spec and the node's settings."""
    s = ctx.settings
    return Rules(
        mode=mode,
        flavor=spec.flavor,
        served_model=served_model,
        continuous=spec.continuous,
        supervision=supervision,
        node_id=ctx.node_id,
        stop_grace_s=s.stop_grace_s,
        health_kill_grace_s=s.health_kill_grace_s,
        reserve_overhead_bytes=s.reserve_overhead_bytes,
    )
