"""The executor's hands: what each effect the core asks for does to the world.

Effects run on the instance actor's thread; the slow ones (reaping a process
group, Ollama loads and unloads, residency questions) run on their own
threads and report back as observations told to the actor. Nothing here
changes sourced state: only appended events do.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from infervisor.adapters import ollama
from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.launched import LaunchedServer
from infervisor.adapters.managed_ollama import OllamaServer, load_timeout_s
from infervisor.adapters.ollama_load import OllamaLoad
from infervisor.adapters.planning import verify_weights
from infervisor.adapters.probe import ProbeTarget
from infervisor.adapters.prober import Prober
from infervisor.adapters.proc.errors import AdapterError, ProcessControlError, SpawnError
from infervisor.adapters.proc.handles import ServerProcess
from infervisor.adapters.proc.waiter import ExitInfo
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.status import LoadKind
from infervisor.replay.state import Stamp

from .clock import RealClock, Timer
from .core import admission
from .core import effects as fx
from .core import observations as o
from .core.common import remaining_s
from .core.supervision import Supervision
from .ledger import BudgetExceeded, Reservation

__all__ = ["EffectRunner", "Owner", "TimerFired"]

log = logging.getLogger(__name__)
_PHYSICAL = RealClock()


class TimerFired(msgspec.Struct, frozen=True):
    """A timer armed by the core fired (``gen`` tells a stale one from the current)."""

    name: fx.Timer
    gen: int


class Owner(Protocol):
    """What the runner needs of the instance actor that owns it."""

    iid: str
    adapter: ServerAdapter
    memory: Reservation
    listeners: dict[int, list[str]] | None

    @property
    def ctx(self) -> Any: ...

    def tell_self(self, message: Any) -> None: ...

    def now(self) -> Stamp: ...

    @property
    def prober(self) -> Prober: ...

    def probe_target(self, timeout_s: float | None = None) -> ProbeTarget: ...


class EffectRunner:
    """Runs one instance's effects; owns its process handle, timers and Ollama load."""

    def __init__(self, actor: Owner) -> None:
        self.actor = actor
        self.proc: ServerProcess | None = None
        self.load: OllamaLoad | None = None
        self.timers: dict[fx.Timer, tuple[int, Timer]] = {}
        self._timer_gen = 0
        self.inflight = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ dispatch
    def run(self, effect: fx.Effect) -> o.Observation | None:
        """Perform one effect; an observation to decide on at once, or None."""
        handler = _HANDLERS[type(effect)]
        result: o.Observation | None = handler(self, effect)
        return result

    # ------------------------------------------------------------------ starts
    def check_start(self, e: fx.CheckStart) -> o.Observation:
        """Run the checks the core names (:func:`~.core.admission.next_start_check`:
        the address, then the weights, blocking this instance only while a changed
        model is hashed, then the memory) until one refuses."""
        found: dict[admission.StartCheck, str | None] = {}
        reserved = 0
        while (check := admission.next_start_check(e, found)) is not None:
            if check is admission.StartCheck.MEMORY:
                found[check], reserved = self._reserve_memory()
            else:
                found[check] = self._start_check(check)
        return admission.start_checked(e, found, reserved)

    def _start_check(self, check: admission.StartCheck) -> str | None:
        """The address taken (``host:port``), or why the weights must not be launched."""
        adapter = self.actor.adapter
        if check is admission.StartCheck.ADDRESS:
            return adapter.address_taken()
        return verify_weights(adapter, ModelRegistry(self.actor.ctx.settings.registry_path))

    def _reserve_memory(self) -> tuple[str | None, int]:
        """Reserve the model's memory (:meth:`start_bytes`): (why it does not fit,
        or None; the bytes held)."""
        try:
            return None, self.actor.memory.reserve(self.start_bytes())
        except BudgetExceeded as err:
            return str(err), 0

    def start_bytes(self) -> int:
        """The model's size a start reserves, bytes (the ledger adds its overhead):
        an Ollama model's is the one Ollama reports now (``/api/tags``), else the
        registry's; read for the start's memory check and for the node's room plan
        of it (actors/node_residency.py), so both weigh the same size.

        Blocking: asks Ollama, up to the probe timeout; run it on this instance's
        own thread. Never raises (Ollama not answering: the registry's size)."""
        adapter = self.actor.adapter
        reported = adapter.reported_size() if isinstance(adapter, OllamaServer) else None
        return admission.start_memory_bytes(adapter.model_bytes, reported)

    def ask_room(self, e: fx.AskRoom) -> None:
        """Ask the node to make room for a start it decided itself (never blocks)."""
        self.actor.ctx.room(self.actor.iid, e.by, e.cause)

    def check_answers(self, e: fx.CheckAnswers) -> o.Observation:
        adapter = self.actor.adapter
        assert isinstance(adapter, AdoptedServer)
        why_not, loading = adapter.confirm_answers(
            self.actor.prober.check(self.actor.probe_target())
        )
        # Exposure comes from the reconcile tick's one socket-table read: a read per
        # start would cost the whole table (tens of ms with hundreds of servers) each.
        return o.AnswersChecked(by=e.by, why_not=why_not, loading=loading)

    def spawn(self, e: fx.Spawn) -> o.Observation:
        adapter = self.actor.adapter
        assert isinstance(adapter, LaunchedServer)
        limit = adapter.spec.memory_max_bytes
        cgroup = self.actor.ctx.containment.cgroup(self.actor.iid, limit)
        enforceable = cgroup is not None and cgroup.memory is not None
        refusal = admission.spawn_limit_refusal(limit, adapter.plan.program, enforceable)
        if refusal is not None:
            return o.SpawnFailed(token=e.token, reason=refusal)
        try:
            proc = adapter.spawn(self.on_exit, e.token, cgroup)
        except SpawnError as err:
            return o.SpawnFailed(token=e.token, reason=str(err))
        self.proc = proc
        i = proc.identity
        argv = [adapter.plan.program, *adapter.plan.args]
        return o.SpawnSucceeded(
            token=e.token, pid=i.pid, pgid=i.pgid, start_time=i.start_time, boot_id=i.boot_id,
            argv=argv,
        )  # fmt: skip

    def on_exit(self, info: ExitInfo) -> None:
        """From the process waiter's thread: tell the actor the leader exited."""
        self.actor.tell_self(o.ProcessExited(pid=info.pid))

    # ------------------------------------------------------------------ termination
    def terminate(self, _: fx.Terminate) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            proc.track_descendants()
            proc.sigterm()
        except (ProcessControlError, AdapterError) as err:
            log.error("%s: SIGTERM failed: %s", self.actor.iid, err)  # noqa: TRY400

    def end_strays(self, _: fx.EndStrays) -> None:
        """Kill what no record claims in the server cgroup, blocking until it is empty."""
        cgroup = self.actor.ctx.containment.cgroup(self.actor.iid)
        if cgroup is None:
            return
        try:
            cgroup.kill()
        except ProcessControlError as err:
            log.error("%s: the strays in its cgroup outlived SIGKILL: %s", self.actor.iid, err)  # noqa: TRY400

    def kill(self, _: fx.Kill) -> None:
        proc = self.proc
        if proc is not None:
            self._thread("kill", lambda: _quietly(self.actor.iid, proc.kill_tree))

    def reap(self, e: fx.Reap) -> o.Observation | None:
        """Reap what is left of the server's tree once its leader exited: at once,
        on this thread, when nothing of it outlived the leader (no grace to give,
        no thread to start, no process table to scan: the exit is decided without
        another hop through the mailbox); else on a thread of its own (what is
        left given the rest of a stop's grace, then killed), reported back."""
        proc = self.proc
        if proc is None:
            return None
        alone = proc.ended_alone()
        if alone is not None:
            return _group_gone(proc, alone, "")

        def run() -> o.Observation:
            proc.settle(e.grace_s)  # a stop's grace is the children's too
            outlived = proc.survivors()
            note = (
                f"{len(outlived)} process(es) of its group outlived it and were killed "
                f"(SIGKILL): pid {', '.join(map(str, outlived[:8]))}"
                if outlived
                else ""
            )
            try:
                info = proc.kill_tree()
            except ProcessControlError as err:
                note = f"{note}; {err}" if note else str(err)
                info = proc.exit_info() or ExitInfo(proc.identity.pid, None, None, "")
            return _group_gone(proc, info, note)

        self._report("reap", run)
        return None

    # ------------------------------------------------------------------ timers
    def arm_timer(self, e: fx.ArmTimer) -> None:
        self.cancel_timer(fx.CancelTimer(name=e.name))
        self._timer_gen += 1
        gen, actor = self._timer_gen, self.actor
        delay = max(0.0, remaining_s(e.due, actor.now()))
        fire = lambda: actor.tell_self(TimerFired(name=e.name, gen=gen))  # noqa: E731
        # A grace period is physical: a process takes the time it takes to exit,
        # whatever clock the node was given, so kill timers run in real time.
        clock = _PHYSICAL if e.name == fx.Timer.KILL else actor.ctx.clock
        self.timers[e.name] = (gen, clock.call_later(delay, fire))

    def cancel_timer(self, e: fx.CancelTimer) -> None:
        armed = self.timers.pop(e.name, None)
        if armed is not None:
            armed[1].cancel()

    def timer_current(self, name: fx.Timer, gen: int) -> bool:
        """True when a fired timer is the one armed last under that name."""
        armed = self.timers.get(name)
        if armed is None or armed[0] != gen:
            return False
        del self.timers[name]
        return True

    # ------------------------------------------------------------------ Ollama
    def check_resident(self, _: fx.CheckResident) -> None:
        adapter = self._ollama()

        def run() -> o.Observation:
            try:
                found = ollama.resident(adapter.spec.base_url, adapter.tag, adapter.probe_timeout_s)
            except AdapterError as err:
                return o.OllamaResidency(resident=False, error=str(err))
            return o.OllamaResidency(resident=found)

        self._report("resident", run)

    def load_model(self, _: fx.LoadModel) -> None:
        """Load within the kind's startup budget (``startup_cap_s``; no allowance:
        ``managed_ollama.DEFAULT_LOAD_TIMEOUT_S``). A load given up at the budget
        ends as a failed load, which the core takes as an exit."""
        supervision = getattr(self.actor, "supervision", None)
        cap = supervision.startup_cap_s if isinstance(supervision, Supervision) else 0.0
        load = self._ollama().begin_load(load_timeout_s(cap))
        self.load = load

        def run() -> o.Observation:
            load.wait()
            state = load.state
            if state.kind is LoadKind.DONE:
                return o.OllamaLoadEnded(ok=True)
            return o.OllamaLoadEnded(ok=False, error=state.error or "", refused=not load.ours)

        self._report("load", run)

    def abort_load(self, _: fx.AbortLoad) -> None:
        if self.load is not None:
            self.load.abort()

    def unload_model(self, _: fx.UnloadModel) -> None:
        adapter = self._ollama()
        if self.load is not None:
            self.load.abort()

        def run() -> o.Observation:
            try:
                ok = adapter.unload_and_wait()
            except AdapterError as err:
                return o.OllamaUnloadEnded(ok=False, error=str(err))
            return o.OllamaUnloadEnded(ok=ok, error="" if ok else "still listed by ollama")

        self._report("unload", run)

    def remove_workdir(self, _: fx.RemoveWorkdir) -> None:
        adapter = self.actor.adapter
        if isinstance(adapter, LaunchedServer):
            shutil.rmtree(adapter.plan.cwd, ignore_errors=True)
            cgroup = self.actor.ctx.containment.cgroup(self.actor.iid)
            if cgroup is not None:
                cgroup.remove()  # empty now: nothing of the server survives its stop

    def _ollama(self) -> OllamaServer:
        adapter = self.actor.adapter
        assert isinstance(adapter, OllamaServer)
        return adapter

    # ------------------------------------------------------------------ threads
    def _report(self, what: str, fn: Callable[[], o.Observation]) -> None:
        """Run ``fn`` on its own thread and tell the actor the observation it returns."""
        actor = self.actor
        self._thread(what, lambda: actor.tell_self(fn()))

    def _thread(self, what: str, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on a daemon thread, counted in :attr:`inflight` until it ends."""
        with self._lock:
            self.inflight += 1

        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("%s: %s failed", self.actor.iid, what)
            finally:
                with self._lock:
                    self.inflight -= 1

        threading.Thread(target=run, name=f"{self.actor.iid[:12]}-{what}", daemon=True).start()

    def close(self) -> None:
        """Cancel every timer and give up on a load in flight."""
        for name in list(self.timers):
            self.cancel_timer(fx.CancelTimer(name=name))
        if self.load is not None:
            self.load.abort()


def _group_gone(proc: ServerProcess, info: ExitInfo, note: str) -> o.GroupGone:
    """Nothing of ``proc``'s tree is left: how it ended, for the core."""
    limit = proc.cgroup.memory_max if proc.cgroup is not None else None
    return o.GroupGone(
        pid=info.pid, exit_code=info.exit_code, signal=info.signal,
        output_tail=info.output_tail, note=note, oom_killed=info.oom_killed,
        memory_max_bytes=limit,
    )  # fmt: skip


def _quietly(iid: str, fn: Callable[[], Any]) -> None:
    """Run a SIGKILL pass; what survives it is logged (the reap reports it too)."""
    try:
        fn()
    except ProcessControlError as err:
        log.warning("%s: SIGKILL did not end everything: %s", iid, err)


_HANDLERS: dict[type[Any], Callable[[EffectRunner, Any], o.Observation | None]] = {
    fx.CheckStart: EffectRunner.check_start,
    fx.AskRoom: EffectRunner.ask_room,
    fx.CheckAnswers: EffectRunner.check_answers,
    fx.Spawn: EffectRunner.spawn,
    fx.Terminate: EffectRunner.terminate,
    fx.Kill: EffectRunner.kill,
    fx.Reap: EffectRunner.reap,
    fx.EndStrays: EffectRunner.end_strays,
    fx.ArmTimer: EffectRunner.arm_timer,
    fx.CancelTimer: EffectRunner.cancel_timer,
    fx.CheckResident: EffectRunner.check_resident,
    fx.LoadModel: EffectRunner.load_model,
    fx.AbortLoad: EffectRunner.abort_load,
    fx.UnloadModel: EffectRunner.unload_model,
    fx.RemoveWorkdir: EffectRunner.remove_workdir,
}
