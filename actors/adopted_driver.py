"""Adopted servers: observe, never signal.

Start only confirms the server answers; stop is refused; unload forgets the
registration; health is watched (misses make it unhealthy, an answer makes it
running again) but nothing is ever restarted. Source:
``reference/infer_lifecycle.rs.txt`` (``start_instance``, ``stop_instance``)
and ``reference/infer_runtime.rs.txt`` (adopted mode).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from infervisor.adapters.adopted import STOP_REFUSAL, AdoptedServer
from infervisor.adapters.errors import AdmissionRefused, ProbeError
from infervisor.adapters.ports import wide_listeners
from infervisor.adapters.probe import HealthKind, ServerReport
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev

from . import messages as m
from .errors import InvalidState, VerbRefused

if TYPE_CHECKING:
    from .instance import InstanceActor

__all__ = ["AdoptedDriver"]

S = LifecycleState
_WATCHED = (S.RUNNING, S.UNHEALTHY)


class AdoptedDriver:
    """Watches a server somebody else runs."""

    def __init__(self, actor: InstanceActor) -> None:
        self.actor = actor
        adapter = actor.adapter
        assert isinstance(adapter, AdoptedServer)
        self.adapter = adapter
        self._misses = 0

    def start(self, by: str) -> None:
        state = self.actor.state
        if state.lifecycle in _WATCHED:
            raise InvalidState(
                f"{state.instance_id} is {state.lifecycle}: already adopted and watched"
            )
        why = self.adapter.confirm_answers()
        if why is not None:
            raise AdmissionRefused(
                f"adopted server is not answering ({why}); "
                "infervisor does not start adopted servers"
            )
        with contextlib.suppress(ProbeError):  # for status' exposure until the next reconcile
            self.actor.listeners = wide_listeners()
        self.actor.commit(ev.Starting(by=by, reset_budget=by == "operator"), by)
        self.actor.commit(ev.Ready(detail="adopted server answers"), by)

    def stop(self, msg: m.Stop) -> Future[m.InstanceView]:
        done: Future[m.InstanceView] = Future()
        if msg.by == "shutdown":
            done.set_result(self.actor.view())  # not ours to stop; it keeps running
            return done
        raise VerbRefused(STOP_REFUSAL.format(iid=self.actor.state.instance_id))

    def unload(self, by: str) -> None:
        self.actor.commit(ev.Unloaded(by=by), by)

    def wants_probe(self) -> int | None:
        state = self.actor.state
        return 0 if state.lifecycle in _WATCHED and state.desired is Desired.RUNNING else None

    def on_probe(self, token: int, report: ServerReport) -> None:
        health = report.health
        lifecycle = self.actor.state.lifecycle
        if health.kind is HealthKind.UP:
            self._misses = 0
            if lifecycle is S.UNHEALTHY:
                self.actor.commit(ev.Recovered(detail="adopted server answers again"), "supervisor")
            return
        self._misses += 1
        limit = self.actor.supervision.miss_limit
        if lifecycle is S.RUNNING and self._misses >= limit:
            why = f"{health.kind}: {health.reason}; adopted servers are not restarted"
            self.actor.commit(ev.Unhealthy(misses=self._misses, reason=why), "supervisor")

    def reconcile(self, listeners: dict[int, list[str]] | None) -> None:
        pass  # nothing to enforce: the binding and the process are not ours

    def boot(self) -> None:
        pass  # re-adopted as it is; health ticks say whether it still answers

    def handle(self, message: Any) -> None:
        pass

    def settled(self) -> bool:
        return True

    def pid(self) -> int | None:
        return None

    def close(self) -> None:
        pass
