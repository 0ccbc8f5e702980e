"""Managed Ollama: load and unload through the API; no process of ours.

Source: ``reference/infer_lifecycle.rs.txt``. A start reserves memory, records
the start, then loads in the background; the load's end is an observation
(``ready``, or an exit with the load error, which also releases the memory).
A stop aborts a load in flight and unloads only what this node asked to load;
the memory is released once Ollama no longer lists the model. Ollama is never
restarted by us: unreachable Ollama makes the instance unhealthy until it
answers again.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import msgspec

from infervisor.adapters.errors import AdapterError
from infervisor.adapters.managed_ollama import OllamaServer
from infervisor.adapters.ollama import OllamaLoad
from infervisor.adapters.probe import HealthKind, ServerReport
from infervisor.adapters.status import LoadKind, LoadState
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev

from . import messages as m
from .errors import InvalidState

if TYPE_CHECKING:
    from .instance import InstanceActor

__all__ = ["OllamaDriver"]

log = logging.getLogger(__name__)
S = LifecycleState


class _LoadEnded(msgspec.Struct, frozen=True):
    generation: int


class _Unloaded(msgspec.Struct, frozen=True):
    ok: bool


class OllamaDriver:
    """Loads one model into Ollama and keeps an eye on it."""

    def __init__(self, actor: InstanceActor) -> None:
        self.actor = actor
        adapter = actor.adapter
        assert isinstance(adapter, OllamaServer)
        self.adapter = adapter
        self.load: OllamaLoad | None = None
        self._generation = 0
        self._misses = 0
        self._unloading = False

    def start(self, by: str) -> None:
        state = self.actor.state
        if self.load is not None and self.load.state.kind is LoadKind.LOADING:
            raise InvalidState(f"{state.instance_id} is already loading")
        if state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY):
            raise InvalidState(f"{state.instance_id} is {state.lifecycle}: already started")
        reserved = self.actor.reserve_memory(by)
        event = ev.Starting(by=by, reset_budget=by == "operator", reserved_bytes=reserved)
        self.actor.commit(event, by)
        self._generation += 1
        generation = self._generation
        self.load = self.adapter.begin_load()
        load = self.load
        self.actor.in_thread(load.wait).add_done_callback(
            lambda _f: self.actor.tell_self(_LoadEnded(generation))
        )

    def handle(self, message: Any) -> None:
        match message:
            case _LoadEnded(generation=generation) if generation == self._generation:
                self._on_load_ended()
            case _Unloaded(ok=ok):
                self._unloading = False
                if ok:  # memory counts as released only once Ollama no longer lists it
                    self.actor.memory.give_back()

    def _on_load_ended(self) -> None:
        load = self.load
        if load is None or load.aborted or self.actor.state.lifecycle is not S.STARTING:
            return
        outcome = load.state
        if outcome.kind is LoadKind.DONE:
            owner = "loaded by this node" if load.ours else "already resident: not ours to unload"
            self.actor.commit(ev.Ready(detail=f"model {self.adapter.tag} {owner}"), "supervisor")
            return
        self.actor.memory.give_back()  # a failed load holds no memory
        why = f"load failed: {outcome.error}"
        self.actor.commit(
            ev.Exited(pid=None, exit_code=None, signal=None, reason=why), "supervisor"
        )

    def stop(self, msg: m.Stop) -> Future[m.InstanceView]:
        state = self.actor.state
        done: Future[m.InstanceView] = Future()
        if (state.lifecycle is S.STOPPED or msg.by == "shutdown") and self.load is None:
            done.set_result(self.actor.view())
            return done
        grace = self.actor.ctx.settings.stop_grace_s if msg.grace_s is None else msg.grace_s
        self.actor.commit(ev.StopRequested(by=msg.by, grace_s=grace, reason=msg.reason), msg.by)
        load, self.load = self.load, None
        if load is not None:
            load.abort()
        if load is None or not load.ours:
            self.actor.memory.give_back()
            done.set_result(self.actor.view())
            return done
        return self._unload_then_release()

    def _unload_then_release(self) -> Future[m.InstanceView]:
        self._unloading = True
        unloaded = self.actor.in_thread(self.adapter.unload_and_wait)
        result: Future[m.InstanceView] = Future()
        actor = self.actor

        def finish(f: Future[Any]) -> None:
            actor.tell_self(_Unloaded(ok=f.exception() is None and bool(f.result())))
            exc = f.exception()
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result(actor.view())

        unloaded.add_done_callback(finish)
        return result

    def unload(self, by: str) -> None:
        load, self.load = self.load, None
        if load is not None:
            load.abort()
            if load.ours:
                with contextlib.suppress(AdapterError):  # best effort: forgotten anyway
                    self.adapter.unload_and_wait()
        # Forgotten here, so its memory is released even if the unload failed:
        # nothing is left to release it later.
        self.actor.memory.give_back()
        self.actor.commit(ev.Unloaded(by=by), by)

    def wants_probe(self) -> int | None:
        state = self.actor.state
        live = state.lifecycle in (S.STARTING, S.RUNNING, S.UNHEALTHY)
        return self._generation if live and state.desired is Desired.RUNNING else None

    def on_probe(self, token: int, report: ServerReport) -> None:
        lifecycle = self.actor.state.lifecycle
        if report.health.kind is HealthKind.UP:
            self._misses = 0
            if lifecycle is S.UNHEALTHY:
                self.actor.commit(ev.Recovered(detail="ollama answers again"), "supervisor")
            return
        self._misses += 1
        if lifecycle is S.RUNNING and self._misses >= self.actor.supervision.miss_limit:
            why = f"{report.health.kind}: {report.health.reason}; infervisor does not start ollama"
            self.actor.commit(ev.Unhealthy(misses=self._misses, reason=why), "supervisor")

    def load_state(self) -> LoadState | None:
        """The background load's state, for status."""
        return self.load.state if self.load is not None else None

    def reconcile(self, listeners: dict[int, list[str]] | None) -> None:
        pass

    def boot(self) -> None:
        state = self.actor.state
        if state.lifecycle in (S.RUNNING, S.UNHEALTHY):
            # Loaded before the node restarted: it still holds its memory. (Whether we
            # loaded it is not in the chain, so a later stop leaves it loaded.)
            with contextlib.suppress(AdapterError):
                self.actor.memory.take()
            return
        if state.lifecycle is S.STARTING:
            why = "the node restarted while the model was loading"
            self.actor.commit(ev.Exited(pid=None, exit_code=None, signal=None, reason=why), "node")
        if state.desired is Desired.RUNNING:
            try:
                self.start("boot")
            except AdapterError as e:
                log.warning("%s: could not resume at boot: %s", state.instance_id, e)

    def settled(self) -> bool:
        loading = self.load is not None and self.load.state.kind is LoadKind.LOADING
        return not loading and not self._unloading

    def pid(self) -> int | None:
        return None

    def close(self) -> None:
        if self.load is not None:
            self.load.abort()
