"""The pure reducer: ``apply(state, event) -> state``.

Live actors and replay call the same functions, so live state and replayed
state cannot disagree. Nothing here does I/O or reads a clock: timestamps come
from the stored event.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent

from . import events as ev
from .callers import Role
from .lifecycle import (
    LIVE_STATES,
    TRANSITIONS,
    IllegalTransition,
    LifecycleState,
    check_transition,
)
from .node_sets import NODE_SET_TYPES as _NODE_SET_TYPES
from .node_sets import node_sets
from .reasons import REASONS as _REASONS
from .reasons import reason_of
from .residency_events import no_room
from .state import (
    Cordon,
    Desired,
    ExitRecord,
    InstanceState,
    LeaseRecord,
    NodeState,
    ProcessRecord,
    RunClock,
    Termination,
    Then,
)

__all__ = ["Folder", "ReplayError", "apply", "apply_instance", "fold", "reason_of"]

S = LifecycleState


class ReplayError(Exception):
    """An event does not fit the state it is applied to (names the seq and why)."""


_INSTANCE_TYPES: frozenset[type[Any]] = frozenset(typing.get_args(ev.InstanceEvent))
"""The event types that belong to one instance (the members of `events.InstanceEvent`)."""
_decode = ev.decode_event
_replace = msgspec.structs.replace
_PLACED, _UNLOADED = ev.Placed, ev.Unloaded
_DECODE = msgspec.json.Decoder(ev.Event).decode
#: The events that open a run (the first of them ends the node's downtime).
_BOOT_TYPES = frozenset({ev.NodeStarted, ev.WitnessOverride})
_TAGS: dict[type[Any], str] = {t: tag for tag, t in ev.EVENT_TYPES.items()}


def apply(state: NodeState, stored: StoredEvent) -> NodeState:
    """Fold one stored event into the node state.

    Raises:
        ReplayError: the event is not the next in sequence, names an unknown
            instance, or makes an illegal transition.
        EventDecodeError: the payload is not a known event.
    """
    if stored.seq != state.head_seq + 1:
        raise ReplayError(f"seq {stored.seq} applied after {state.head_seq}: not the next event")
    base = msgspec.structs.replace(state, head_seq=stored.seq, head_hash=stored.hash_hex())
    if stored.kind == GENESIS_KIND:
        return base
    event = ev.decode_event(stored)
    kind = type(event)
    run = state.run.after(stored.ts_ns, boot=kind in _BOOT_TYPES)
    base = msgspec.structs.replace(base, run=run)
    if kind is ev.NodeStarted:
        return msgspec.structs.replace(base, boots=state.boots + 1)
    if kind is ev.LeaseRenewed:
        assert isinstance(event, ev.LeaseRenewed)
        lease = LeaseRecord(controller=event.controller, at=event.at, down_ns=run.down_ns)
        leases = {**state.leases, event.controller: lease}
        return msgspec.structs.replace(base, lease=lease, leases=leases)
    if kind in _NODE_SET_TYPES:
        cordon, sets = node_sets(state.cordon, state.placement_sets, event)
        return msgspec.structs.replace(base, cordon=cordon, placement_sets=sets)
    if kind not in _INSTANCE_TYPES:
        return base
    current = state.instances.get(stored.subject)
    updated = apply_instance(current, stored, event)  # type: ignore[arg-type]
    instances = dict(state.instances)
    if updated is None:
        instances.pop(stored.subject, None)
    else:
        instances[stored.subject] = updated
    return msgspec.structs.replace(base, instances=instances)


class Folder:
    """`apply` for a whole chain without a new `NodeState` per event.

    Feed it the stored events in seq order (`feed`, usable as the consumer
    of `infervisor.chain.scan_chain`), then read `state()`. The result is
    what folding the same events with `apply` gives; the instances are kept
    in one dict changed in place, which only this object sees.
    """

    __slots__ = (
        "_base", "_booting", "_boots", "_cordon", "_down_ns", "_head", "_head_ns", "_instances",
        "_lease", "_leases", "_next", "_node_id", "_sets",
    )  # fmt: skip

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._head: StoredEvent | None = None
        #: The head (seq, hash hex) of the state resumed from, until an event is fed.
        self._base: tuple[int, str] = (-1, "")
        self._next = 0
        self._instances: dict[str, InstanceState] = {}
        self._boots = 0
        self._head_ns = self._down_ns = 0
        self._booting = False
        self._lease: LeaseRecord | None = None
        self._leases: dict[str, LeaseRecord] = {}
        self._cordon = Cordon.NONE
        self._sets: dict[str, int] = {}

    @classmethod
    def resume(cls, state: NodeState) -> Folder:
        """A folder holding `state` (a snapshot's: replay/snapshot.py), to be fed
        the events after ``state.head_seq``; ``state()`` gives `state` back until then."""
        folder = cls(state.node_id)
        folder._base = (state.head_seq, state.head_hash)
        folder._next = state.head_seq + 1
        folder._instances = dict(state.instances)
        folder._boots = state.boots
        folder._head_ns, folder._down_ns = state.run.head_ns, state.run.down_ns
        folder._booting = state.run.booting
        folder._lease = state.lease
        folder._leases = dict(state.leases)
        folder._cordon = state.cordon
        folder._sets = dict(state.placement_sets)
        return folder

    def instance(self, instance_id: str) -> InstanceState | None:
        """The instance's state after the events fed so far (None: not placed)."""
        return self._instances.get(instance_id)

    @property
    def head_seq(self) -> int:
        """Seq of the last event fed (-1 before genesis)."""
        return self._base[0] if self._head is None else self._head.seq

    def feed(self, stored: StoredEvent) -> None:
        """Fold one event. Raises as `apply` does (ReplayError, EventDecodeError)."""
        if stored.seq != self._next:
            raise ReplayError(
                f"seq {stored.seq} applied after {self._next - 1}: not the next event"
            )
        self._next += 1
        self._head = stored
        if stored.kind == GENESIS_KIND:
            return
        try:  # decode_event's common case, inlined: a current payload of the header's kind
            event: ev.Event = _DECODE(stored.payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            event = _decode(stored)  # names the problem, or upcasts
        else:
            if event.v != 1 or _TAGS[type(event)] != stored.kind:
                event = _decode(stored)
        kind = type(event)
        boot = kind in _BOOT_TYPES  # RunClock.after, kept as plain values on this hot path
        if boot and not self._booting and self._head_ns:
            self._down_ns += max(0, stored.ts_ns - self._head_ns)
        self._head_ns, self._booting = stored.ts_ns, boot
        if kind in _INSTANCE_TYPES:
            instances = self._instances
            subject = stored.subject
            updated = _apply_instance(instances.get(subject), stored, event)  # type: ignore[arg-type]
            if updated is None:
                instances.pop(subject, None)
            else:
                instances[subject] = updated
        elif kind is ev.NodeStarted:
            self._boots += 1
        elif kind is ev.LeaseRenewed:
            assert isinstance(event, ev.LeaseRenewed)
            self._lease = LeaseRecord(
                controller=event.controller, at=event.at, down_ns=self._down_ns
            )
            self._leases[event.controller] = self._lease
        elif kind in _NODE_SET_TYPES:
            self._cordon, self._sets = node_sets(self._cordon, self._sets, event)

    def state(self, node_id: str = "") -> NodeState:
        """The node state after the events fed so far (`node_id` overrides the one given)."""
        head = self._head
        return NodeState(
            node_id=node_id or self._node_id,
            head_seq=self._base[0] if head is None else head.seq,
            head_hash=self._base[1] if head is None else head.hash.hex(),
            instances=dict(self._instances),
            boots=self._boots,
            lease=self._lease,
            leases=dict(self._leases),
            run=RunClock(head_ns=self._head_ns, down_ns=self._down_ns, booting=self._booting),
            cordon=self._cordon,
            placement_sets=dict(self._sets),
        )


def fold(node_id: str, stored_events: Iterable[StoredEvent]) -> NodeState:
    """Replay a whole chain (starting at its genesis, seq 0) into node state.

    Raises:
        ReplayError, EventDecodeError: as `apply`.
    """
    folder = Folder(node_id)
    feed = folder.feed
    for stored in stored_events:
        feed(stored)
    return folder.state()


def apply_instance(
    inst: InstanceState | None, stored: StoredEvent, event: ev.InstanceEvent
) -> InstanceState | None:
    """Fold one instance event into that instance's state (``None``: not placed / unloaded).

    Raises:
        ReplayError: unknown instance, a second placement, or an illegal transition.
    """
    kind = type(event)
    if kind is _PLACED:
        if inst is not None:
            raise ReplayError(f"seq {stored.seq}: {stored.subject} is already placed")
        return _placed(stored, event)  # type: ignore[arg-type]
    if inst is None:
        raise ReplayError(f"seq {stored.seq}: {stored.kind} for unknown instance {stored.subject}")
    if stored.seq <= inst.last_seq:
        raise ReplayError(f"seq {stored.seq} is not after {inst.last_seq} for {inst.instance_id}")
    if kind is _UNLOADED:
        return None
    current = inst.lifecycle
    fixed, dependent, loops, handler, reasoner = _RULES[kind]
    target = _target(inst, event) if dependent else fixed
    changes = {} if handler is None else handler(inst, stored, event)
    changes["last_seq"] = stored.seq
    if target is not None and (target is not current or loops):
        if target not in TRANSITIONS[current]:
            try:
                check_transition(current, target, inst.instance_id)
            except IllegalTransition as e:
                raise ReplayError(f"seq {stored.seq}: {e}") from e
        changes["lifecycle"] = target
        changes["since_ns"] = stored.ts_ns
        changes["reason"] = reasoner(event)
    return _replace(inst, **changes)


_apply_instance = apply_instance


def _placed(stored: StoredEvent, event: ev.Placed) -> InstanceState:
    return InstanceState(
        instance_id=stored.subject,
        spec=event.spec,
        placed_by=event.placed_by,
        generation=event.generation,
        lifecycle=S.RESTING if event.spec.get("on_demand") else S.LOADED,
        desired=Desired.STOPPED,
        since_ns=stored.ts_ns,
        last_seq=stored.seq,
        reason=reason_of(event),
    )


_FIXED_TARGETS: dict[type[Any], LifecycleState] = {
    ev.Starting: S.STARTING,
    ev.Ready: S.RUNNING,
    ev.Unhealthy: S.UNHEALTHY,
    ev.Recovered: S.RUNNING,
    ev.RestartScheduled: S.RESTARTING,
    ev.Failed: S.FAILED,
    ev.Finished: S.FINISHED,
}


_DEPENDENT_TARGETS: frozenset[type[Any]] = frozenset({ev.Exited, ev.StopRequested, ev.Exposed})
"""Events whose target state depends on the state they are applied to."""


def _target(inst: InstanceState, event: ev.InstanceEvent) -> LifecycleState | None:
    """The lifecycle state an event moves to, or None when it changes no state."""
    kind = type(event)
    fixed = _FIXED_TARGETS.get(kind)
    if fixed is not None:
        return fixed
    if kind is ev.Exited:
        if inst.lifecycle is not S.STOPPING:
            return S.EXITED
        return S.RESTING if inst.then == Then.REST else S.STOPPED
    if kind is ev.StopRequested or kind is ev.Exposed:
        if inst.lifecycle is S.STOPPING:
            return None  # a second stop escalates; the state is already right
        has_process = inst.process is not None and inst.lifecycle in LIVE_STATES
        if has_process:
            return S.STOPPING
        rests = kind is ev.StopRequested and event.then == Then.REST  # type: ignore[union-attr]
        return S.RESTING if rests else S.STOPPED
    return None


def _on_starting(inst: InstanceState, stored: StoredEvent, e: ev.Starting) -> dict[str, Any]:
    budget: dict[str, Any] = {}
    if e.reset_budget:
        budget = {"restarts": 0, "restart_times_ns": (), "restart_stamps": ()}
    return dict(
        desired=Desired.RUNNING,
        process=None,
        launch_token=e.launch_token,
        restart_due=None,
        terminating=None,
        then=Then.NOTHING,
        then_by="",
        refusal="",
        unload_error="",
        up_since=None,
        reserved_bytes=e.reserved_bytes,
        stopped_by="",
        **budget,
    )


def _on_spawned(inst: InstanceState, stored: StoredEvent, e: ev.Spawned) -> dict[str, Any]:
    return dict(process=_process(e), up_since=e.at)


def _on_reattached(inst: InstanceState, stored: StoredEvent, e: ev.Reattached) -> dict[str, Any]:
    return dict(up_since=e.up_since or inst.up_since)


def _on_exited(inst: InstanceState, stored: StoredEvent, e: ev.Exited) -> dict[str, Any]:
    return dict(
        process=None,
        last_exit=_exit(e, stored.ts_ns),
        oom_kills=inst.oom_kills + (1 if e.oom_killed else 0),
        terminating=None,
        up_since=None,
        reserved_bytes=0,
    )


def _on_restart(inst: InstanceState, stored: StoredEvent, e: ev.RestartScheduled) -> dict[str, Any]:
    times = (*inst.restart_times_ns, stored.ts_ns)
    stamps = (*inst.restart_stamps, e.at) if e.at is not None else inst.restart_stamps
    return dict(
        restarts=inst.restarts + 1,
        restart_times_ns=times,
        restart_stamps=stamps,
        restart_due=e.due,
    )


def _on_held(inst: InstanceState, stored: StoredEvent, e: ev.InstanceEvent) -> dict[str, Any]:
    return dict(desired=Desired.STOPPED, restart_due=None, then=Then.NOTHING)


def _on_stable(inst: InstanceState, stored: StoredEvent, e: ev.StableAgain) -> dict[str, Any]:
    return dict(restarts=0, restart_times_ns=(), restart_stamps=())


def _on_exposed(inst: InstanceState, stored: StoredEvent, e: ev.Exposed) -> dict[str, Any]:
    return dict(
        desired=Desired.STOPPED, exposed=tuple(e.addresses), restart_due=None, then=Then.NOTHING
    )


def _on_replaced(inst: InstanceState, stored: StoredEvent, e: ev.Replaced) -> dict[str, Any]:
    return dict(placed_by=e.placed_by, generation=e.generation)


def _on_stop(inst: InstanceState, stored: StoredEvent, e: ev.StopRequested) -> dict[str, Any]:
    keeps_wanted = e.by == Role.SHUTDOWN or e.then == Then.RESTART
    desired = inst.desired if keeps_wanted else Desired.STOPPED
    terminating = inst.terminating
    if inst.process is not None and e.at is not None:
        why = f" ({e.reason})" if e.reason else ""
        terminating = Termination(
            cause=f"stopped by {e.by}{why}", grace_s=e.grace_s, by=e.by, at=e.at
        )
    then, then_by = e.then, e.by
    if e.by == Role.SHUTDOWN and not e.then:
        then, then_by = inst.then, inst.then_by  # a shutdown leaves a pending restart pending
    held_by = "" if keeps_wanted or e.then == Then.REST else e.by
    return dict(
        stopped_by=held_by or (inst.stopped_by if keeps_wanted else ""),
        desired=desired,
        restart_due=None,
        then=then,
        then_by=then_by if then else "",
        terminating=terminating,
        unload_error="",
    )


def _on_terminating(inst: InstanceState, stored: StoredEvent, e: ev.Terminating) -> dict[str, Any]:
    record = Termination(cause=e.cause, grace_s=e.grace_s, by=Role.SUPERVISOR, at=e.at)
    return dict(terminating=record)


def _on_ready(inst: InstanceState, stored: StoredEvent, e: ev.Ready) -> dict[str, Any]:
    return dict(up_since=inst.up_since or e.at)


def _on_refused(inst: InstanceState, stored: StoredEvent, e: ev.StartRefused) -> dict[str, Any]:
    """A refused start keeps its cause; one a demand asked for ends the demand (the
    next request asks again), so no boot resumes a request that failed long ago."""
    if inst.lifecycle in (S.RESTING, S.LOADED) and inst.desired is Desired.RUNNING:
        return dict(refusal=e.reason, desired=Desired.STOPPED)
    return dict(refusal=e.reason)


def _on_claimed(inst: InstanceState, stored: StoredEvent, e: ev.ModelClaimed) -> dict[str, Any]:
    return dict(ollama_owned=e.ours)


def _on_dropped(inst: InstanceState, stored: StoredEvent, e: ev.ModelDropped) -> dict[str, Any]:
    return dict(ollama_owned=False)


def _on_corrected(
    inst: InstanceState, stored: StoredEvent, e: ev.MemoryCorrected
) -> dict[str, Any]:
    return dict(reserved_bytes=e.reserved_bytes)


def _on_released(inst: InstanceState, stored: StoredEvent, e: ev.MemoryReleased) -> dict[str, Any]:
    return dict(reserved_bytes=0)


def _on_unload_failed(
    inst: InstanceState, stored: StoredEvent, e: ev.UnloadFailed
) -> dict[str, Any]:
    return dict(unload_error=e.error)


def _on_demanded(
    inst: InstanceState, stored: StoredEvent, e: ev.ResidencyDemanded
) -> dict[str, Any]:
    return dict(desired=Desired.RUNNING, last_use_ns=stored.ts_ns, stopped_by="")


def _on_room_refused(
    inst: InstanceState, stored: StoredEvent, e: ev.ResidencyRefused
) -> dict[str, Any]:
    """The demand that asked is refused: a resting instance is no longer wanted
    running; the refusal is kept (once per cause, as a refused start's)."""
    refusal = no_room(e.needed_bytes, e.in_use_bytes, e.budget_bytes)
    if inst.lifecycle in (S.RESTING, S.LOADED):
        return dict(desired=Desired.STOPPED, refusal=refusal)
    return dict(refusal=refusal)


def _on_busy(inst: InstanceState, stored: StoredEvent, e: ev.ResidencyBusy) -> dict[str, Any]:
    return dict(busy=True, last_use_ns=stored.ts_ns)


def _on_idle(inst: InstanceState, stored: StoredEvent, e: ev.ResidencyIdle) -> dict[str, Any]:
    return dict(busy=False, last_use_ns=e.idle_since_ns)


#: What each kind of event changes besides the transition (applied in one replace).
_UPDATES: dict[type[Any], Callable[[InstanceState, StoredEvent, Any], dict[str, Any]]] = {
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
    ev.ModelDropped: _on_dropped,
    ev.MemoryCorrected: _on_corrected,
    ev.UnloadFailed: _on_unload_failed,
    ev.ResidencyDemanded: _on_demanded,
    ev.ResidencyRefused: _on_room_refused,
    ev.ResidencyBusy: _on_busy,
    ev.ResidencyIdle: _on_idle,
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
        oom_killed=event.oom_killed,
    )


_Rule = tuple[
    LifecycleState | None,
    bool,
    bool,
    Callable[[InstanceState, StoredEvent, Any], dict[str, Any]] | None,
    Callable[[Any], str],
]

#: Per instance event type, in one lookup: the state it moves to (None: no move),
#: whether that depends on the state it meets (`_target`), whether it re-enters
#: its own state, what else it changes (`_UPDATES`) and the reason it records.
_RULES: dict[type[Any], _Rule] = {
    t: (
        _FIXED_TARGETS.get(t),
        t in _DEPENDENT_TARGETS,
        t is ev.RestartScheduled,
        _UPDATES.get(t),
        _REASONS[t],
    )
    for t in _INSTANCE_TYPES
    if t not in (ev.Placed, ev.Unloaded)
}
