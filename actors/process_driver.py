"""Managed llama.cpp and mlx-lm: a server process under supervision.

Sources: ``reference/infer_lifecycle.rs.txt`` (start over a free address only,
stop by SIGTERM then SIGKILL of the group, reconcile with backoff and budget,
exposure) and ``reference/host_supervise.rs.txt`` (misses make it unhealthy;
a spent budget leaves it Failed, held for the operator).
"""

from __future__ import annotations

import logging
import random
import shutil
import signal
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import msgspec

from infervisor.adapters.errors import (
    AdmissionRefused,
    ProcessControlError,
    SpawnError,
)
from infervisor.adapters.launched import LaunchedServer
from infervisor.adapters.probe import ServerReport
from infervisor.adapters.process import ExitInfo, ServerProcess
from infervisor.adapters.status import map_report
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.policy import Exhausted, decide_restart

from . import messages as m
from .clock import Timer
from .errors import InvalidState
from .kinds import HealthSample, Healthy, Unhealthy, judge
from .recovery import recover_process

if TYPE_CHECKING:
    from .instance import InstanceActor

__all__ = ["ProcessDriver", "describe_exit"]

log = logging.getLogger(__name__)
S = LifecycleState
UNLOAD_GRACE_S = 5.0
EXPOSURE_GRACE_S = 3.0


class _Exited(msgspec.Struct, frozen=True):
    info: ExitInfo


class _Terminated(msgspec.Struct, frozen=True):
    pid: int
    info: ExitInfo
    cause: str


class _RestartDue(msgspec.Struct, frozen=True):
    token: int


class ProcessDriver:
    """Launches, watches, restarts and stops one server process."""

    def __init__(self, actor: InstanceActor) -> None:
        self.actor = actor
        adapter = actor.adapter
        assert isinstance(adapter, LaunchedServer)
        self.adapter = adapter
        self.proc: ServerProcess | None = None
        self._started_at = 0.0
        self._misses = 0
        self._terminating = False
        self._restart_timer: Timer | None = None
        self._restart_token = 0
        self._stop_waiters: list[Future[m.InstanceView]] = []
        self._rng = random.Random()  # noqa: S311 - backoff jitter, not secrets

    @property
    def state(self) -> Any:
        return self.actor.state

    def commit(self, event: ev.InstanceEvent, source: str = "supervisor") -> None:
        self.actor.commit(event, source)

    # ------------------------------------------------------------------ verbs
    def start(self, by: str) -> None:
        if self.state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY, S.STOPPING):
            raise InvalidState(
                f"{self.state.instance_id} is {self.state.lifecycle}: start needs it loaded, "
                "stopped, exited, failed, finished or restarting"
            )
        self._cancel_restart()
        self.launch(by, reset_budget=by == "operator")

    def stop(self, msg: m.Stop) -> Future[m.InstanceView]:
        done: Future[m.InstanceView] = Future()
        grace = self.actor.ctx.settings.stop_grace_s if msg.grace_s is None else msg.grace_s
        nothing_to_stop = self.state.lifecycle is S.STOPPED or msg.by == "shutdown"
        if nothing_to_stop and self.proc is None:
            # A node shutdown leaves an instance with no server as the chain says it is.
            self._cancel_restart()
            done.set_result(self.actor.view())
            return done
        self._cancel_restart()
        escalate = self.state.lifecycle is S.STOPPING
        self.commit(ev.StopRequested(by=msg.by, grace_s=grace, reason=msg.reason), msg.by)
        if self.proc is None:
            done.set_result(self.actor.view())
            return done
        self._stop_waiters.append(done)
        if escalate:
            self.proc.kill()  # a second stop: SIGKILL now (never a reused group)
        else:
            why = f" ({msg.reason})" if msg.reason else ""
            self.terminate(grace, cause=f"stopped by {msg.by}{why}")
        return done

    def unload(self, by: str) -> None:
        self._cancel_restart()
        if self.proc is not None:
            if self.state.lifecycle is not S.STOPPING:
                self.commit(ev.StopRequested(by=by, grace_s=UNLOAD_GRACE_S, reason="unload"), by)
            info = self.proc.terminate(UNLOAD_GRACE_S)  # raises with the handle still held
            self.proc = None
            self._terminating = False
            self.commit(_exited_event(info, "stopped for unload"), by)
            self._resolve_stops()
        self.actor.memory.give_back()
        self.commit(ev.Unloaded(by=by), by)
        shutil.rmtree(self.adapter.plan.cwd, ignore_errors=True)

    # ------------------------------------------------------------------ launching
    def launch(self, by: str, *, reset_budget: bool = False, attempt: int = 0) -> None:
        """Start the server: refuse over a taken address or an exhausted budget
        (both recorded), reserve memory, record, spawn, record.

        Raises:
            InvalidState: stopped for exposure; reload the instance.
            AdmissionRefused: the address is taken or the memory does not fit.
            SpawnError: the program could not be launched (recorded as an exit).
        """
        if self.state.exposed:
            raise InvalidState(
                f"the server was stopped for listening beyond loopback "
                f"({', '.join(self.state.exposed)}); reload the instance"
            )
        self._refuse_if_taken(by)
        reserved = self.actor.reserve_memory(by)
        event = ev.Starting(
            by=by, reset_budget=reset_budget, attempt=attempt, reserved_bytes=reserved
        )
        self.commit(event, by)
        try:
            proc = self.adapter.spawn(self.exit_callback())
        except SpawnError as e:
            self.actor.memory.give_back()
            self.commit(ev.Exited(pid=None, exit_code=None, signal=None, reason=str(e)), by)
            self.after_exit()
            raise
        self.attach(proc)
        i = proc.identity
        argv = [self.adapter.plan.program, *self.adapter.plan.args]
        spawned = ev.Spawned(
            pid=i.pid, pgid=i.pgid, start_time=i.start_time, boot_id=i.boot_id, argv=argv
        )
        self.commit(spawned, by)
        if self.actor.supervision.probe == "process":
            self.commit(ev.Ready(detail="alive (process kind: a live process is healthy)"), by)

    def _refuse_if_taken(self, by: str) -> None:
        taken = self.adapter.address_taken()
        if taken is not None:
            why = f"{taken} is already taken by something else; not starting over it"
            self.commit(ev.StartRefused(by=by, reason=why), by)
            raise AdmissionRefused(why)

    def attach(self, proc: ServerProcess) -> None:
        """Own ``proc`` from now on (just spawned: its uptime starts now)."""
        self.proc = proc
        self._started_at = self.actor.ctx.clock.monotonic()
        self._misses = 0
        self.actor.report = None

    def reattach(self, proc: ServerProcess) -> None:
        """Own a process found running after a node restart; it holds its memory again.

        Its uptime is counted from its own start time, so a server that has
        been up longer than the stability period clears its budget as usual.
        """
        self.attach(proc)
        alive_for = max(0.0, self.actor.ctx.clock.wall_ns() / 1e9 - proc.identity.start_time)
        self._started_at -= alive_for
        if self.actor.ctx.ledger is not None:
            try:
                self.actor.memory.take()
            except AdmissionRefused as e:
                log.warning("%s: re-attached over the memory budget: %s", self.state.instance_id, e)

    def exit_callback(self) -> Any:
        """What the process waiter calls: tell this actor the process exited."""
        actor = self.actor

        def on_exit(info: ExitInfo) -> None:
            actor.tell_self(_Exited(info))

        return on_exit

    # ------------------------------------------------------------------ exits
    def terminate(self, grace: float, cause: str) -> None:
        """End the process group on a helper thread; :class:`_Terminated` reports back."""
        proc = self.proc
        if proc is None or self._terminating:
            return
        self._terminating = True
        actor = self.actor

        def run() -> None:
            why = cause
            try:
                info = proc.terminate(grace)
            except ProcessControlError as e:
                # Recorded rather than left stopping forever; the reason says what survived.
                log.error("%s: %s", actor.state.instance_id, e)  # noqa: TRY400
                info = ExitInfo(proc.identity.pid, None, None, _joined(proc.output())[-4096:])
                why = f"{cause}; {e}"
            actor.tell_self(_Terminated(pid=proc.identity.pid, info=info, cause=why))

        threading.Thread(target=run, name=f"terminate-{proc.identity.pid}", daemon=True).start()

    def handle(self, message: Any) -> None:
        match message:
            case _Exited(info=info):
                self._on_exit(info)
            case _Terminated():
                self._on_terminated(message)
            case _RestartDue(token=token):
                self._on_restart_due(token)

    def _on_exit(self, info: ExitInfo) -> None:
        if self.proc is None or info.pid != self.proc.identity.pid or self._terminating:
            return  # stale, or our own terminate will report
        # Make sure nothing of the group is left before the exit is recorded.
        self.terminate(0.0, cause="exited on its own")

    def _on_terminated(self, msg: _Terminated) -> None:
        if self.proc is None or msg.pid != self.proc.identity.pid:
            return
        self.proc = None
        self._terminating = False
        self.actor.memory.give_back()
        self.commit(_exited_event(msg.info, msg.cause))
        if self.state.lifecycle is S.STOPPED:
            self._resolve_stops()
        else:
            self.after_exit(msg.info.exit_code)

    def _resolve_stops(self) -> None:
        view = self.actor.view()
        for waiter in self._stop_waiters:
            waiter.set_result(view)
        self._stop_waiters.clear()

    def after_exit(self, exit_code: int | None = None) -> None:
        """The process is gone while wanted: a one-shot that exited 0 is finished;
        otherwise restart after the backoff, or give up."""
        if self.state.desired is not Desired.RUNNING or self.state.lifecycle is not S.EXITED:
            return
        if exit_code == 0 and not self.adapter.spec.continuous:
            self.commit(ev.Finished(exit_code=0))
            return
        self._decide_restart(self.state.reason)

    def _decide_restart(self, reason: str) -> None:
        policy = self.actor.supervision.restart
        decision = decide_restart(self.state, policy, self.actor.ctx.clock.wall_ns(), self._rng)
        if isinstance(decision, Exhausted):
            why = f"restart budget spent ({decision.attempts} restarts): {reason}"
            self.commit(ev.Failed(attempts=decision.attempts, reason=why))
            return
        event = ev.RestartScheduled(
            attempt=decision.attempt, delay_s=decision.delay_s, reason=reason
        )
        self.commit(event)
        self._arm_restart(decision.delay_s)

    # ------------------------------------------------------------------ restarts
    def _arm_restart(self, delay: float) -> None:
        self._cancel_restart()
        self._restart_token += 1
        token, actor = self._restart_token, self.actor
        timer = actor.ctx.clock.call_later(delay, lambda: actor.tell_self(_RestartDue(token)))
        self._restart_timer = timer

    def _cancel_restart(self) -> None:
        if self._restart_timer is not None:
            self._restart_timer.cancel()
            self._restart_timer = None
        self._restart_token += 1

    def _on_restart_due(self, token: int) -> None:
        if token != self._restart_token or self.state.lifecycle is not S.RESTARTING:
            return
        self._restart_timer = None
        if self.state.desired is not Desired.RUNNING or self.proc is not None:
            return
        try:
            self.launch("supervisor", attempt=self.state.restarts)
        except AdmissionRefused as e:
            self._decide_restart(str(e))
        except SpawnError:
            pass  # recorded as an exit; after_exit already decided

    # ------------------------------------------------------------------ health
    def wants_probe(self) -> int | None:
        if self.proc is None or self._terminating or self.actor.supervision.probe != "http":
            return None
        if self.state.lifecycle not in (S.STARTING, S.RUNNING):
            return None
        return self.proc.identity.pid

    def on_probe(self, token: int, report: ServerReport) -> None:
        if self.proc is None or token != self.proc.identity.pid or self._terminating:
            return
        # Remember what the server started, so a descendant that escapes its
        # process group is still found and ended at stop.
        self.proc.track_descendants()
        failure = self.adapter.failure_in_output(_joined(self.proc.output()))
        if failure is not None and self.state.lifecycle is S.STARTING:
            self._miss(f"the server reported: {failure}", at_once=True)
            return
        verdict = judge(self.actor.supervision, self._sample(report))
        if isinstance(verdict, Unhealthy):
            self._miss(verdict.reason)
        elif isinstance(verdict, Healthy):
            self._healthy(verdict.serving)

    def _sample(self, report: ServerReport) -> HealthSample:
        spec = self.adapter.spec
        status = map_report(
            spec.flavor, self.adapter.served_model, report, alive=True, adopted=False, load=None
        )
        return HealthSample(
            status=status,
            continuous=spec.continuous,
            starting=self.state.lifecycle is S.STARTING,
            elapsed_s=self.actor.ctx.clock.monotonic() - self._started_at,
        )

    def _healthy(self, serving: bool) -> None:
        self._misses = 0
        if not serving:
            return
        if self.state.lifecycle is S.STARTING:
            self.commit(ev.Ready(detail=_models_note(self.actor.report)))
            return
        uptime = self.actor.ctx.clock.monotonic() - self._started_at
        if self.state.restarts and uptime >= self.actor.supervision.restart.stable_after_s:
            self.commit(ev.StableAgain(uptime_s=uptime))

    def _miss(self, reason: str, *, at_once: bool = False) -> None:
        self._misses += 1
        if not at_once and self._misses < self.actor.supervision.miss_limit:
            return
        self.commit(ev.Unhealthy(misses=self._misses, reason=reason))
        if self.state.desired is Desired.RUNNING:
            grace = self.actor.ctx.settings.health_kill_grace_s
            self.terminate(grace, cause=f"killed: {reason}")

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, listeners: dict[int, list[str]] | None) -> None:
        if self.proc is not None and not self._terminating:
            if listeners is not None:
                self._enforce_loopback(listeners.get(self.adapter.spec.port, []))
            return
        idle = self._restart_timer is None
        if idle and self.state.desired is Desired.RUNNING and self.state.lifecycle is S.EXITED:
            self.after_exit()

    def _enforce_loopback(self, beyond: list[str]) -> None:
        """A server we started must not answer beyond loopback: stop it, hold it."""
        if not beyond:
            return
        self._cancel_restart()
        self.commit(ev.Exposed(addresses=beyond))
        self.terminate(EXPOSURE_GRACE_S, cause="stopped: listening beyond loopback")

    def boot(self) -> None:
        recover_process(self)

    # ------------------------------------------------------------------ view
    def settled(self) -> bool:
        return not self._terminating

    def pid(self) -> int | None:
        return self.proc.identity.pid if self.proc is not None else None

    def close(self) -> None:
        self._cancel_restart()


def _joined(output: tuple[str, str]) -> str:
    return output[0][-8192:] + "\n" + output[1][-8192:]


def _exited_event(info: ExitInfo, cause: str) -> ev.Exited:
    return ev.Exited(
        pid=info.pid,
        exit_code=info.exit_code,
        signal=info.signal,
        reason=f"{cause}: {describe_exit(info)}",
        output_tail=info.output_tail[-2048:],
    )


def describe_exit(info: ExitInfo) -> str:
    """``exit code 1``, ``signal 9 (SIGKILL)``, or that the status cannot be known."""
    if info.signal is None and info.exit_code is None:
        return "exit status unknown (re-attached after a node restart: not our child)"
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
