"""The instance actor: one per instance, sole owner of its process and state.

Every lifecycle change follows the one rule: decide, build the event, check
it against the same reducer replay uses, append it (durable), then apply it.
Slow work never runs on the actor's thread: probes run on a one-worker pool
and terminations on their own thread; both report back as messages, so a
hung server never holds up ``status``. Sources: ``reference/infer_lifecycle.rs.txt``
(start, stop, reconcile) and ``reference/host_supervise.rs.txt`` (misses,
bounded restarts, Failed held for the operator).
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
import pykka

from infervisor.adapters.errors import AdmissionRefused, SpawnError
from infervisor.adapters.probe import HealthKind, ServerReport
from infervisor.adapters.process import ExitInfo, ManagedProcess, kill_group
from infervisor.adapters.server import ServerAdapter
from infervisor.chain import EventDraft, StoredEvent
from infervisor.replay import Desired, InstanceState, LifecycleState, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.events import encode_event
from infervisor.replay.policy import Exhausted, decide_restart

from . import messages as m
from .clock import Clock, Timer
from .errors import InvalidState
from .recovery import recover
from .settings import NodeSettings
from .view import build_view

__all__ = ["InstanceActor", "InstanceContext"]

log = logging.getLogger(__name__)
S = LifecycleState
UNLOAD_GRACE_S = 5.0


@dataclass(frozen=True)
class InstanceContext:
    """What every instance actor of a node shares (read-only)."""

    node_id: str
    writer: pykka.ActorRef[Any]
    clock: Clock
    settings: NodeSettings


# Private messages the actor sends itself from its helper threads and timers.
class _Exited(msgspec.Struct, frozen=True):
    info: ExitInfo


class _Terminated(msgspec.Struct, frozen=True):
    pid: int
    info: ExitInfo
    cause: str


class _Probed(msgspec.Struct, frozen=True):
    pid: int
    report: ServerReport


class _RestartDue(msgspec.Struct, frozen=True):
    token: int


class InstanceActor(pykka.ThreadingActor):
    """Owns one instance. Answers verbs; acts on ticks and on its own observations."""

    def __init__(self, state: InstanceState, adapter: ServerAdapter, ctx: InstanceContext) -> None:
        super().__init__()
        self.state = state
        self.adapter = adapter
        self.ctx = ctx
        self._proc: ManagedProcess | None = None
        self._started_at = 0.0
        self._misses = 0
        self._report: ServerReport | None = None
        self._probing = False
        self._probes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe")
        self._terminating = False
        self._restart_timer: Timer | None = None
        self._restart_token = 0
        self._stop_waiters: list[Future[m.InstanceView]] = []
        self._rng = random.Random()  # noqa: S311 - backoff jitter, not secrets

    # ------------------------------------------------------------------ dispatch
    def on_receive(self, message: Any) -> Any:
        match message:
            case m.GetStatus():
                return build_view(self.state, self._report, self._proc)
            case m.IsSettled():
                return not (self._probing or self._terminating)
            case m.Start(by=by):
                return self._start_verb(by)
            case m.Stop():
                return self._stop_verb(message)
            case m.Restart(by=by):
                return self._restart_verb(by)
            case m.Unload(by=by):
                return self._unload_verb(by)
        try:
            self._observe(message)
        except Exception:
            # A handler that raises must not end the actor: the instance keeps its process.
            log.exception("%s: error handling %r", self.state.instance_id, message)
        return None

    def _observe(self, message: Any) -> None:
        match message:
            case m.HealthTick():
                self._health_tick()
            case m.ReconcileTick():
                self._reconcile()
            case m.Boot():
                recover(self)
            case _Exited(info=info):
                self._on_exit(info)
            case _Terminated():
                self._on_terminated(message)
            case _Probed():
                self._on_probed(message)
            case _RestartDue(token=token):
                self._on_restart_due(token)

    def on_stop(self) -> None:
        self._cancel_restart()
        self._probes.shutdown(wait=False, cancel_futures=True)
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
        apply_instance(self.state, _provisional(draft, self.state.last_seq + 1), event)
        stored: StoredEvent = self.ctx.writer.ask(m.Append(drafts=(draft,)), block=True)[0]
        new = apply_instance(self.state, stored, event)
        if new is not None:
            self.state = new
        return stored

    # ------------------------------------------------------------------ verbs
    def _start_verb(self, by: str) -> m.InstanceView:
        if self.state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY, S.STOPPING):
            raise InvalidState(
                f"{self.state.instance_id} is {self.state.lifecycle}: start needs it loaded, "
                "stopped, exited, failed, finished or restarting"
            )
        self._cancel_restart()
        self.launch(by, reset_budget=by == "operator")
        return self.view()

    def _stop_verb(self, msg: m.Stop) -> Future[m.InstanceView]:
        done: Future[m.InstanceView] = Future()
        grace = self.ctx.settings.stop_grace_s if msg.grace_s is None else msg.grace_s
        if self.state.lifecycle is S.STOPPED and self._proc is None:
            done.set_result(self.view())
            return done
        self._cancel_restart()
        escalate = self.state.lifecycle is S.STOPPING
        self.commit(ev.StopRequested(by=msg.by, grace_s=grace, reason=msg.reason), msg.by)
        if self._proc is None:
            done.set_result(self.view())
            return done
        self._stop_waiters.append(done)
        if escalate:
            kill_group(self._proc.identity.pgid, signal.SIGKILL)
        else:
            self.terminate(grace, cause=f"stopped by {msg.by}")
        return done

    def _restart_verb(self, by: str) -> Future[m.InstanceView]:
        if self._proc is None:
            done: Future[m.InstanceView] = Future()
            done.set_result(self._start_verb(by))
            return done
        stopped = self._stop_verb(m.Stop(by=by, reason="restart"))
        ref = self.actor_ref
        restarted: Future[m.InstanceView] = Future()

        def then_start(_: Future[m.InstanceView]) -> None:
            try:
                restarted.set_result(ref.ask(m.Start(by=by), block=True))
            except Exception as e:  # noqa: BLE001 - handed to the caller's future
                restarted.set_exception(e)

        stopped.add_done_callback(lambda f: threading.Thread(target=then_start, args=(f,)).start())
        return restarted

    def _unload_verb(self, by: str) -> None:
        self._cancel_restart()
        if self._proc is not None:
            if self.state.lifecycle is not S.STOPPING:
                self.commit(ev.StopRequested(by=by, grace_s=UNLOAD_GRACE_S, reason="unload"), by)
            proc, self._proc = self._proc, None
            info = proc.terminate(UNLOAD_GRACE_S)
            self.commit(_exited_event(info, "stopped for unload"), by)
        self.commit(ev.Unloaded(by=by), by)
        workdir = getattr(self.adapter, "plan", None)
        if workdir is not None:
            shutil.rmtree(workdir.cwd, ignore_errors=True)

    # ------------------------------------------------------------------ launching
    def launch(self, by: str, *, reset_budget: bool = False, attempt: int = 0) -> None:
        """Start the server: refuse over a taken address (recorded), record, spawn, record.

        Raises:
            AdmissionRefused: the address is taken (the refusal is in the chain).
            SpawnError: the program could not be launched (recorded as an exit).
        """
        taken = self.adapter.address_taken()
        if taken is not None:
            why = f"{taken} is already taken by something else; not starting over it"
            self.commit(ev.StartRefused(by=by, reason=why), by)
            raise AdmissionRefused(why)
        self.commit(ev.Starting(by=by, reset_budget=reset_budget, attempt=attempt), by)
        try:
            proc = self.adapter.spawn(self._exit_callback())
        except SpawnError as e:
            self.commit(ev.Exited(pid=None, exit_code=None, signal=None, reason=str(e)), by)
            self.after_exit()
            raise
        self.attach(proc)
        i = proc.identity
        argv = [*_argv(self.adapter)]
        spawned = ev.Spawned(
            pid=i.pid, pgid=i.pgid, start_time=i.start_time, boot_id=i.boot_id, argv=argv
        )
        self.commit(spawned, by)

    def attach(self, proc: ManagedProcess) -> None:
        """Own ``proc`` from now on (spawned now, or found again at boot)."""
        self._proc = proc
        self._started_at = self.ctx.clock.monotonic()
        self._misses = 0
        self._report = None

    def _exit_callback(self) -> Any:
        ref = self.actor_ref

        def on_exit(info: ExitInfo) -> None:
            _tell(ref, _Exited(info))

        return on_exit

    # ------------------------------------------------------------------ exits
    def terminate(self, grace: float, cause: str) -> None:
        """End the process group on a helper thread; :class:`_Terminated` reports back."""
        proc = self._proc
        if proc is None or self._terminating:
            return
        self._terminating = True
        ref = self.actor_ref

        def run() -> None:
            info = proc.terminate(grace)
            _tell(ref, _Terminated(pid=proc.identity.pid, info=info, cause=cause))

        threading.Thread(target=run, name=f"terminate-{proc.identity.pid}", daemon=True).start()

    def _on_exit(self, info: ExitInfo) -> None:
        if self._proc is None or info.pid != self._proc.identity.pid or self._terminating:
            return  # stale, or our own terminate will report
        # Make sure nothing of the group is left before the exit is recorded.
        self.terminate(0.0, cause="exited on its own")

    def _on_terminated(self, msg: _Terminated) -> None:
        if self._proc is None or msg.pid != self._proc.identity.pid:
            return
        self._proc = None
        self._terminating = False
        self.commit(_exited_event(msg.info, msg.cause), "supervisor")
        if self.state.lifecycle is S.STOPPED:
            self._resolve_stops()
        else:
            self.after_exit()

    def _resolve_stops(self) -> None:
        view = self.view()
        for waiter in self._stop_waiters:
            waiter.set_result(view)
        self._stop_waiters.clear()

    def after_exit(self) -> None:
        """The process is gone while wanted: restart after the backoff, or give up."""
        if self.state.desired is not Desired.RUNNING or self.state.lifecycle is not S.EXITED:
            return
        reason = self.state.reason
        decision = decide_restart(
            self.state, self.ctx.settings.restart, self.ctx.clock.wall_ns(), self._rng
        )
        if isinstance(decision, Exhausted):
            why = f"restart budget spent ({decision.attempts} restarts): {reason}"
            self.commit(ev.Failed(attempts=decision.attempts, reason=why), "supervisor")
            return
        event = ev.RestartScheduled(
            attempt=decision.attempt, delay_s=decision.delay_s, reason=reason
        )
        self.commit(event, "supervisor")
        self._arm_restart(decision.delay_s)

    # ------------------------------------------------------------------ restarts
    def _arm_restart(self, delay: float) -> None:
        self._cancel_restart()
        self._restart_token += 1
        token, ref = self._restart_token, self.actor_ref
        self._restart_timer = self.ctx.clock.call_later(
            delay, lambda: _tell(ref, _RestartDue(token))
        )

    def _cancel_restart(self) -> None:
        if self._restart_timer is not None:
            self._restart_timer.cancel()
            self._restart_timer = None
        self._restart_token += 1

    def _on_restart_due(self, token: int) -> None:
        if token != self._restart_token or self.state.lifecycle is not S.RESTARTING:
            return
        self._restart_timer = None
        if self.state.desired is not Desired.RUNNING or self._proc is not None:
            return
        try:
            self.launch("supervisor", attempt=self.state.restarts)
        except AdmissionRefused as e:
            self._retry_after_refusal(str(e))
        except SpawnError:
            pass  # recorded as an exit; after_exit already decided

    def _retry_after_refusal(self, why: str) -> None:
        decision = decide_restart(
            self.state, self.ctx.settings.restart, self.ctx.clock.wall_ns(), self._rng
        )
        if isinstance(decision, Exhausted):
            reason = f"restart budget spent ({decision.attempts} restarts): {why}"
            self.commit(ev.Failed(attempts=decision.attempts, reason=reason), "supervisor")
            return
        event = ev.RestartScheduled(attempt=decision.attempt, delay_s=decision.delay_s, reason=why)
        self.commit(event, "supervisor")
        self._arm_restart(decision.delay_s)

    # ------------------------------------------------------------------ health
    def _health_tick(self) -> None:
        proc = self._proc
        if proc is None or self._terminating or self._probing:
            return
        if self.state.lifecycle not in (S.STARTING, S.RUNNING):
            return
        self._probing = True
        ref, adapter, pid = self.actor_ref, self.adapter, proc.identity.pid
        self._probes.submit(lambda: _tell(ref, _Probed(pid=pid, report=adapter.probe())))

    def _on_probed(self, msg: _Probed) -> None:
        self._probing = False
        if self._proc is None or msg.pid != self._proc.identity.pid or self._terminating:
            return
        self._report = msg.report
        health = msg.report.health
        if self.state.lifecycle is S.STARTING:
            self._judge_starting(health.kind, health.reason)
        elif self.state.lifecycle is S.RUNNING:
            self._judge_running(health.kind, health.reason)

    def _judge_starting(self, kind: HealthKind, reason: str) -> None:
        if kind is HealthKind.UP:
            self.commit(ev.Ready(detail=_models_note(self._report)), "supervisor")
            return
        waited = self.ctx.clock.monotonic() - self._started_at
        if kind is HealthKind.UNHEALTHY:
            self._miss(reason)
        elif waited > self.ctx.settings.startup_timeout_s:
            why = f"not ready after {waited:.0f} s (startup timeout): {kind}: {reason}"
            self._miss(why, at_once=True)

    def _judge_running(self, kind: HealthKind, reason: str) -> None:
        if kind is not HealthKind.UP:
            self._miss(f"{kind}: {reason}" if reason else str(kind))
            return
        self._misses = 0
        uptime = self.ctx.clock.monotonic() - self._started_at
        if self.state.restarts and uptime >= self.ctx.settings.restart.stable_after_s:
            self.commit(ev.StableAgain(uptime_s=uptime), "supervisor")

    def _miss(self, reason: str, *, at_once: bool = False) -> None:
        self._misses += 1
        if not at_once and self._misses < self.ctx.settings.miss_limit:
            return
        self.commit(ev.Unhealthy(misses=self._misses, reason=reason), "supervisor")
        if self.state.desired is Desired.RUNNING:
            self.terminate(self.ctx.settings.health_kill_grace_s, cause=f"killed: {reason}")

    # ------------------------------------------------------------------ reconcile
    def _reconcile(self) -> None:
        idle = self._proc is None and self._restart_timer is None
        if idle and self.state.desired is Desired.RUNNING and self.state.lifecycle is S.EXITED:
            self.after_exit()

    def view(self) -> m.InstanceView:
        """This instance's status view."""
        return build_view(self.state, self._report, self._proc)


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


def _exited_event(info: ExitInfo, cause: str) -> ev.Exited:
    return ev.Exited(
        pid=info.pid,
        exit_code=info.exit_code,
        signal=info.signal,
        reason=f"{cause}: {describe_exit(info)}",
        output_tail=info.output_tail[-2048:],
    )


def describe_exit(info: ExitInfo) -> str:
    """``exit code 1`` or ``signal 9 (SIGKILL)``."""
    if info.signal is not None:
        try:
            name = signal.Signals(info.signal).name
        except ValueError:
            name = "?"
        return f"signal {info.signal} ({name})"
    return f"exit code {info.exit_code}"


def _models_note(report: ServerReport | None) -> str:
    if report is None or not report.models:
        return ""
    return "models: " + ", ".join(report.models[:4])


def _argv(adapter: ServerAdapter) -> list[str]:
    plan = getattr(adapter, "plan", None)
    return [plan.program, *plan.args] if plan is not None else []


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    """Tell, ignoring an actor that has already stopped (late timers and threads)."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)
