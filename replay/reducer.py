"""The pure reducer: ``apply(state, event) -> state``.

Live actors and replay call the same functions, so live state and replayed
state cannot disagree. Nothing here does I/O or reads a clock: timestamps come
from the stored event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent

from . import events as ev
from .lifecycle import LIVE_STATES, IllegalTransition, LifecycleState, check_transition
from .state import (
    Desired,
    ExitRecord,
    InstanceState,
    LeaseRecord,
    NodeState,
    ProcessRecord,
    Termination,
)

__all__ = ["ReplayError", "apply", "apply_instance", "fold", "reason_of"]

S = LifecycleState


class ReplayError(Exception):
    """An event does not fit the state it is applied to (names the seq and why)."""


def apply(state: NodeState, stored: StoredEvent) -> NodeState:
    """Fold one stored event into the node state.

    Raises:
        ReplayError: the event is not the next in sequence, names an unknown
            instance, or makes an illegal transition.
    """
    if stored.seq != state.head_seq + 1:
        raise ReplayError(f"seq {stored.seq} applied after {state.head_seq}: not the next event")
    base = msgspec.structs.replace(state, head_seq=stored.seq, head_hash=stored.hash_hex())
    if stored.kind == GENESIS_KIND:
        return base
    event = ev.decode_event(stored)
    if isinstance(event, ev.NodeStarted):
        return msgspec.structs.replace(base, boots=state.boots + 1)
    if isinstance(event, ev.LeaseRenewed):
        lease = LeaseRecord(controller=event.controller, at=event.at)
        return msgspec.structs.replace(base, lease=lease)
    if not isinstance(event, ev.InstanceEvent):
        return base
    current = state.instances.get(stored.subject)
    updated = apply_instance(current, stored, event)
    instances = dict(state.instances)
    if updated is None:
        instances.pop(stored.subject, None)
    else:
        instances[stored.subject] = updated
    return msgspec.structs.replace(base, instances=instances)


def fold(node_id: str, stored_events: Iterable[StoredEvent]) -> NodeState:
    """Replay a whole chain (starting at its genesis, seq 0) into node state."""
    state = NodeState(node_id=node_id, head_seq=-1, head_hash="")
    for stored in stored_events:
        state = apply(state, stored)
    return state


def apply_instance(
    inst: InstanceState | None, stored: StoredEvent, event: ev.InstanceEvent
) -> InstanceState | None:
    """Fold one instance event into that instance's state (``None``: not placed / unloaded).

    Raises:
        ReplayError: unknown instance, a second placement, or an illegal transition.
    """
    if isinstance(event, ev.Placed):
        if inst is not None:
            raise ReplayError(f"seq {stored.seq}: {stored.subject} is already placed")
        return _placed(stored, event)
    if inst is None:
        raise ReplayError(f"seq {stored.seq}: {stored.kind} for unknown instance {stored.subject}")
    if stored.seq <= inst.last_seq:
        raise ReplayError(f"seq {stored.seq} is not after {inst.last_seq} for {inst.instance_id}")
    if isinstance(event, ev.Unloaded):
        return None
    inst = msgspec.structs.replace(inst, last_seq=stored.seq)
    target = _target(inst, event)
    if (target is not None and target is not inst.lifecycle) or _self_loop(inst, event):
        inst = _enter(inst, target or inst.lifecycle, stored, event)
    return _update(inst, stored, event)


def _placed(stored: StoredEvent, event: ev.Placed) -> InstanceState:
    return InstanceState(
        instance_id=stored.subject,
        spec=event.spec,
        placed_by=event.placed_by,
        generation=event.generation,
        lifecycle=S.LOADED,
        desired=Desired.STOPPED,
        since_ns=stored.ts_ns,
        last_seq=stored.seq,
        reason=reason_of(event),
    )


def _target(inst: InstanceState, event: ev.InstanceEvent) -> LifecycleState | None:
    """The lifecycle state an event moves to, or None when it changes no state."""
    match event:
        case ev.Starting():
            return S.STARTING
        case ev.Ready():
            return S.RUNNING
        case ev.Unhealthy():
            return S.UNHEALTHY
        case ev.Recovered():
            return S.RUNNING
        case ev.Exited():
            return S.STOPPED if inst.lifecycle is S.STOPPING else S.EXITED
        case ev.RestartScheduled():
            return S.RESTARTING
        case ev.Failed():
            return S.FAILED
        case ev.Finished():
            return S.FINISHED
        case ev.StopRequested() | ev.Exposed():
            if inst.lifecycle is S.STOPPING:
                return None  # a second stop escalates; the state is already right
            has_process = inst.process is not None and inst.lifecycle in LIVE_STATES
            return S.STOPPING if has_process else S.STOPPED
    return None


def _self_loop(inst: InstanceState, event: ev.InstanceEvent) -> bool:
    """Events that re-enter the same state and must still be checked and timed."""
    return isinstance(event, ev.RestartScheduled) and inst.lifecycle is S.RESTARTING


def _enter(
    inst: InstanceState, to: LifecycleState, stored: StoredEvent, event: ev.InstanceEvent
) -> InstanceState:
    try:
        check_transition(inst.lifecycle, to, inst.instance_id)
    except IllegalTransition as e:
        raise ReplayError(f"seq {stored.seq}: {e}") from e
    return msgspec.structs.replace(
        inst, lifecycle=to, since_ns=stored.ts_ns, reason=reason_of(event)
    )


def _update(inst: InstanceState, stored: StoredEvent, event: ev.InstanceEvent) -> InstanceState:
    """The data an event carries besides the transition."""
    handler = _UPDATES.get(type(event))
    return handler(inst, stored, event) if handler is not None else inst


def _on_starting(inst: InstanceState, stored: StoredEvent, e: ev.Starting) -> InstanceState:
    budget: dict[str, Any] = {}
    if e.reset_budget:
        budget = {"restarts": 0, "restart_times_ns": (), "restart_stamps": ()}
    return msgspec.structs.replace(
        inst,
        desired=Desired.RUNNING,
        process=None,
        launch_token=e.launch_token,
        restart_due=None,
        terminating=None,
        then="",
        then_by="",
        refusal="",
        up_since=None,
        reserved_bytes=e.reserved_bytes,
        **budget,
    )


def _on_spawned(inst: InstanceState, stored: StoredEvent, e: ev.Spawned) -> InstanceState:
    return msgspec.structs.replace(inst, process=_process(e), up_since=e.at)


def _on_reattached(inst: InstanceState, stored: StoredEvent, e: ev.Reattached) -> InstanceState:
    return msgspec.structs.replace(inst, up_since=e.up_since or inst.up_since)


def _on_exited(inst: InstanceState, stored: StoredEvent, e: ev.Exited) -> InstanceState:
    return msgspec.structs.replace(
        inst,
        process=None,
        last_exit=_exit(e, stored.ts_ns),
        terminating=None,
        up_since=None,
        reserved_bytes=0,
    )


def _on_restart(inst: InstanceState, stored: StoredEvent, e: ev.RestartScheduled) -> InstanceState:
    times = (*inst.restart_times_ns, stored.ts_ns)
    stamps = (*inst.restart_stamps, e.at) if e.at is not None else inst.restart_stamps
    return msgspec.structs.replace(
        inst,
        restarts=inst.restarts + 1,
        restart_times_ns=times,
        restart_stamps=stamps,
        restart_due=e.due,
    )


def _on_held(inst: InstanceState, stored: StoredEvent, e: ev.InstanceEvent) -> InstanceState:
    return msgspec.structs.replace(inst, desired=Desired.STOPPED, restart_due=None, then="")


def _on_stable(inst: InstanceState, stored: StoredEvent, e: ev.StableAgain) -> InstanceState:
    return msgspec.structs.replace(inst, restarts=0, restart_times_ns=(), restart_stamps=())


def _on_exposed(inst: InstanceState, stored: StoredEvent, e: ev.Exposed) -> InstanceState:
    return msgspec.structs.replace(
        inst, desired=Desired.STOPPED, exposed=tuple(e.addresses), restart_due=None, then=""
    )


def _on_replaced(inst: InstanceState, stored: StoredEvent, e: ev.Replaced) -> InstanceState:
    return msgspec.structs.replace(inst, placed_by=e.placed_by, generation=e.generation)


def _on_stop(inst: InstanceState, stored: StoredEvent, e: ev.StopRequested) -> InstanceState:
    keeps_wanted = e.by == "shutdown" or e.then == "restart"
    desired = inst.desired if keeps_wanted else Desired.STOPPED
    terminating = inst.terminating
    if inst.process is not None and e.at is not None:
        why = f" ({e.reason})" if e.reason else ""
        terminating = Termination(
            cause=f"stopped by {e.by}{why}", grace_s=e.grace_s, by=e.by, at=e.at
        )
    then, then_by = e.then, e.by
    if e.by == "shutdown" and not e.then:
        then, then_by = inst.then, inst.then_by  # a shutdown leaves a pending restart pending
    return msgspec.structs.replace(
        inst,
        desired=desired,
        restart_due=None,
        then=then,
        then_by=then_by if then else "",
        terminating=terminating,
    )


def _on_terminating(inst: InstanceState, stored: StoredEvent, e: ev.Terminating) -> InstanceState:
    record = Termination(cause=e.cause, grace_s=e.grace_s, by="supervisor", at=e.at)
    return msgspec.structs.replace(inst, terminating=record)


def _on_ready(inst: InstanceState, stored: StoredEvent, e: ev.Ready) -> InstanceState:
    return msgspec.structs.replace(inst, up_since=inst.up_since or e.at)


def _on_refused(inst: InstanceState, stored: StoredEvent, e: ev.StartRefused) -> InstanceState:
    return msgspec.structs.replace(inst, refusal=e.reason)


def _on_claimed(inst: InstanceState, stored: StoredEvent, e: ev.ModelClaimed) -> InstanceState:
    return msgspec.structs.replace(inst, ollama_owned=e.ours)


def _on_released(inst: InstanceState, stored: StoredEvent, e: ev.MemoryReleased) -> InstanceState:
    return msgspec.structs.replace(inst, reserved_bytes=0)


_UPDATES: dict[type[Any], Callable[[InstanceState, StoredEvent, Any], InstanceState]] = {
    ev.Starting: _on_starting,
    ev.Spawned: _on_spawned,
    ev.Reattached: _on_reattached,
    ev.Exited: _on_exited,
    ev.RestartScheduled: _on_restart,
    ev.Failed: _on_held,
    ev.Finished: _on_held,
    ev.StableAgain: _on_stable,
    ev.Exposed: _on_exposed,
    ev.Replaced: _on_replaced,
    ev.StopRequested: _on_stop,
    ev.Terminating: _on_terminating,
    ev.StartRefused: _on_refused,
    ev.Ready: _on_ready,
    ev.ModelClaimed: _on_claimed,
    ev.MemoryReleased: _on_released,
}


def _process(event: ev.Spawned) -> ProcessRecord:
    return ProcessRecord(
        pid=event.pid, pgid=event.pgid, start_time=event.start_time, boot_id=event.boot_id
    )


def _exit(event: ev.Exited, ts_ns: int) -> ExitRecord:
    return ExitRecord(
        pid=event.pid,
        exit_code=event.exit_code,
        signal=event.signal,
        reason=event.reason,
        ts_ns=ts_ns,
        output_tail=event.output_tail,
    )


def _starting(e: ev.Starting) -> str:
    attempt = f" (restart {e.attempt})" if e.attempt else ""
    budget = "; restart budget reset" if e.reset_budget else ""
    return f"start by {e.by}{attempt}{budget}"


def _stop(e: ev.StopRequested) -> str:
    return f"stop by {e.by} (grace {e.grace_s + 0.0:g} s)" + (f": {e.reason}" if e.reason else "")


def _ready(e: ev.Ready) -> str:
    return "health probe answered: serving" + (f" ({e.detail})" if e.detail else "")


_REASONS: dict[type[Any], Callable[[Any], str]] = {
    ev.Placed: lambda e: f"placed by {e.placed_by} (generation {e.generation})",
    ev.Replaced: lambda e: f"placed again by {e.placed_by} (generation {e.generation})",
    ev.PlacementIgnored: lambda e: (
        f"stale placement by {e.placed_by} ignored: generation {e.generation} "
        f"is older than {e.current}"
    ),
    ev.Starting: _starting,
    ev.Spawned: lambda e: f"spawned pid {e.pid} (group {e.pgid})",
    ev.Reattached: lambda e: f"re-attached pid {e.pid} after the node restarted",
    ev.StartRefused: lambda e: f"start by {e.by} refused: {e.reason}",
    ev.Ready: _ready,
    ev.Unhealthy: lambda e: f"{e.misses} missed health checks: {e.reason}",
    ev.Recovered: lambda e: "health recovered",
    ev.Exited: lambda e: e.reason,
    ev.RestartScheduled: lambda e: f"restart {e.attempt} in {e.delay_s:g} s: {e.reason}",
    ev.Failed: lambda e: e.reason,
    ev.Finished: lambda e: "one-shot run ended cleanly (exit code 0); not restarted",
    ev.StableAgain: lambda e: f"up {e.uptime_s:.0f} s: restart budget cleared",
    ev.StopRequested: _stop,
    ev.Unloaded: lambda e: f"unloaded by {e.by}",
    ev.Exposed: lambda e: f"listening beyond loopback on {', '.join(e.addresses)}: stopped",
    ev.Terminating: lambda e: f"{e.cause} (SIGKILL after {e.grace_s:g} s)",
    ev.ModelClaimed: lambda e: (
        "model loaded by this node" if e.ours else "model already resident: not ours to unload"
    ),
    ev.MemoryReleased: lambda e: f"memory released ({e.bytes} bytes)",
    ev.LeaseRenewed: lambda e: f"controller {e.controller} heard",
    ev.AdmissionRefused: lambda e: f"placement refused: {e.reason}",
    ev.NodeStarted: lambda e: f"node started (pid {e.pid})",
    ev.NodeStopped: lambda e: f"node stopped: {e.reason}",
}


def reason_of(event: ev.Event) -> str:
    """One line saying why an event happened, for timelines and status."""
    return _REASONS[type(event)](event)
