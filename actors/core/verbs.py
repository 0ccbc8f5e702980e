"""Verbs every managed mode shares: start, restart, placement and the lease.

How a mode stops (a process is signalled, an Ollama model unloaded) is the
mode's own (``process.stop``, ``ollama.stop``), handed to the shared rules
here as a :data:`Stop`. Source: ``reference/infer_lifecycle.rs.txt``
(``start_instance``, ``stop_instance``) and ``reference/host_supervise.rs.txt``
(``expire_lease``).
"""

from __future__ import annotations

from collections.abc import Callable

from infervisor.replay import Desired, LifecycleState
from infervisor.replay import events as ev
from infervisor.replay.callers import lease_source
from infervisor.replay.durations import seconds
from infervisor.replay.state import Then

from .common import STARTABLE, try_start, unloading
from .decision import Draft, RefusalKind
from .effects import CancelTimer, Timer
from .observations import LeaseLapsed, PlacementVerb, RestartVerb, StartVerb

__all__ = ["UP", "Stop", "lease_lapsed", "placement", "restart", "start_verb"]

S = LifecycleState
#: States with something up (a server starting or serving).
UP = frozenset({S.STARTING, S.RUNNING, S.UNHEALTHY})

#: A mode's stop: ``stop(draft, by, grace_s, reason, then)``.
Stop = Callable[[Draft, str, float, str, Then], None]


def start_verb(d: Draft, v: StartVerb) -> None:
    """Idempotent: answer a live instance as it is; refuse one stopping; else check, start.

    An instance already starting, running or unhealthy (the supervisor handles
    that) gets no event and no refusal. One stopping, one held for listening
    beyond loopback, and one whose Ollama model is still being unloaded are
    refused with the reason. Otherwise the start is checked, then made."""
    inst = d.inst
    if inst.lifecycle in UP:
        return  # already starting or running: nothing to do
    if inst.lifecycle not in STARTABLE:
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is {inst.lifecycle}: start it once it has stopped",
        )
        return
    if inst.exposed:
        d.refuse(
            RefusalKind.INVALID_STATE,
            "the server was stopped for listening beyond loopback "
            f"({', '.join(inst.exposed)}); reload the instance",
        )
        return
    if unloading(inst):
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is unloading its model: start it once the unload has ended",
        )
        return
    d.do(CancelTimer(name=Timer.RESTART))
    try_start(d, v.by, verb=True, demand=v.room)


def restart(d: Draft, v: RestartVerb, *, holds_something: bool, stop: Stop) -> None:
    """Stop (when anything runs), then start: one decision; restarts coalesce."""
    inst = d.inst
    if inst.then == Then.RESTART:
        return  # a restart is already under way: this one joins it
    if inst.lifecycle is S.STOPPING:
        d.refuse(
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is stopping: start it once it has stopped",
        )
        return
    if holds_something:
        stop(d, v.by, v.grace_s, "restart", Then.RESTART)
        return
    if inst.exposed:
        start_verb(d, StartVerb(by=v.by))  # refused with the reason
        return
    d.do(CancelTimer(name=Timer.RESTART))
    try_start(d, v.by, verb=True, demand=v.room)


def placement(d: Draft, p: PlacementVerb) -> None:
    """A newer generation is applied and an older one ignored; both are recorded."""
    current = d.inst.generation
    if p.generation > current:
        d.emit(ev.Replaced(placed_by=p.placed_by, generation=p.generation))
        return
    d.emit(ev.PlacementIgnored(placed_by=p.placed_by, generation=p.generation, current=current))


def lease_lapsed(d: Draft, lease: LeaseLapsed, stop: Stop) -> None:
    """Stop a continuous instance the lapsed controller placed and that is wanted
    running (by ``lease:CONTROLLER``). An instance another controller placed, or
    this node, is not that lease's: it stays as it is (issue 19: a lease is per
    controller, whoever else is heard).

    Wanted running is what the controller's placement holds, whatever the
    lifecycle: a restart whose start was refused (stopped with the restart
    pending) or an exit awaiting its restart is held stopped too, so no later
    tick starts it without a controller."""
    inst, rules = d.inst, d.rules
    if not rules.continuous or inst.placed_by == rules.node_id:
        return
    if inst.placed_by != lease.controller or inst.desired is not Desired.RUNNING:
        return
    why = (
        f"controller lease expired: controller {lease.controller} not heard for "
        f"{seconds(lease.silent_s)}"
    )
    stop(d, lease_source(lease.controller), rules.stop_grace_s, why, Then.NOTHING)
