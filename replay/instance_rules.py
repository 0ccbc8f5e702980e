"""What each instance event does to its instance: the state it moves to and the
fields it changes, as one table (`RULES`) and one function (`advance`).

`advance` changes an `InstanceFields` record in place: replay (replay/folder.py)
keeps one such record per instance for a whole chain, and the pure reducer
(replay/reducer.py `apply_instance`) gives it a copy and freezes the result,
so the live node and replay run the same rules. Nothing here does I/O or
reads a clock: timestamps come from the stored event.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from . import events as ev
from . import residency_events as rev
from .callers import Role, role_of
from .durations import seconds
from .lifecycle import LIVE_STATES, TRANSITIONS, IllegalTransition, LifecycleState, check_transition
from .reasons import REASONS, reason_of
from .residency_events import no_room
from .state import Desired, ExitRecord, InstanceFields, ProcessRecord, Termination, Then

__all__ = ["INSTANCE_TYPES", "RULES", "Pending", "ReplayError", "advance", "settle"]

S = LifecycleState


class ReplayError(Exception):
    """An event does not fit the state it is applied to (names the seq and why)."""


INSTANCE_TYPES: frozenset[type[Any]] = frozenset(typing.get_args(ev.InstanceEvent))
"""The event types that belong to one instance (the members of `events.InstanceEvent`)."""

_PLACED, _UNLOADED = ev.Placed, ev.Unloaded


def advance(  # noqa: PLR0917 - the stored event's fields, as the folder holds them
    work: InstanceFields | None,
    event: ev.InstanceEvent,
    seq: int,
    ts_ns: int,
    kind: str,
    subject: str,
    pending: Pending | None = None,
) -> InstanceFields | None:
    """Fold one instance event into `work`, in place (``None``: not placed / unloaded).

    `seq`, `ts_ns`, `kind` and `subject` are the stored event's (its header):
    replay hands them without a `StoredEvent` per row (chain/verify.py, `Verified`).
    Returns the record that holds the instance now: `work` itself, a new one
    for a placement, or None once unloaded. On an error `work` is unchanged.

    With `pending`, a transition's reason is not formatted: its event goes to
    ``pending[instance_id]``, and whoever reads the record first sets ``reason``
    from the last one (`settle`; replay/folder.py does, so a chain formats one
    reason per instance, not one per transition).

    Raises:
        ReplayError: unknown instance, a second placement, or an illegal transition.
    """
    if work is None or type(event) is _PLACED:
        return _first(work is not None, event, seq, ts_ns, kind, subject)
    if seq <= work.last_seq:
        raise ReplayError(f"seq {seq} is not after {work.last_seq} for {work.instance_id}")
    kind_of = type(event)
    if kind_of is _UNLOADED:
        return None
    current = work.lifecycle
    fixed, dependent, loops, handler, reasoner = RULES[kind_of]
    target = _target(work, event) if dependent else fixed
    moves = target is not None and (target is not current or loops)
    if moves and target not in TRANSITIONS[current]:
        try:
            check_transition(current, target, work.instance_id)  # type: ignore[arg-type]
        except IllegalTransition as e:
            raise ReplayError(f"seq {seq}: {e}") from e
    if handler is not None:
        handler(work, ts_ns, event)
    work.last_seq = seq
    if moves:
        work.lifecycle = target  # type: ignore[assignment]
        work.since_ns = ts_ns
        if pending is None:
            work.reason = reasoner(event)
        else:
            pending[work.instance_id] = event
        if target not in LIVE_STATES:
            work.busy = False  # no process serves anything: the busy spell ended with it
    return work


def _first(  # noqa: PLR0917 - as `advance`
    placed: bool,
    event: ev.InstanceEvent,
    seq: int,
    ts_ns: int,
    kind: str,
    subject: str,
) -> InstanceFields:
    """`advance` of a placement, or of any event for an instance not placed (refused);
    ``placed``: whether the instance has a record already (a second placement)."""
    if type(event) is not _PLACED:
        raise ReplayError(f"seq {seq}: {kind} for unknown instance {subject}")
    if placed:
        raise ReplayError(f"seq {seq}: {subject} is already placed")
    return _placed(subject, seq, ts_ns, event)


Pending = dict[str, Any]
"""Per instance id, the event of its last transition whose reason is not formatted yet."""


def settle(work: InstanceFields, pending: Pending) -> InstanceFields:
    """`work` with its reason set from ``pending`` (its entry removed), as `advance`
    without `pending` would have left it."""
    due = pending.pop(work.instance_id, None)
    if due is not None:
        work.reason = REASONS[type(due)](due)
    return work


def _placed(subject: str, seq: int, ts_ns: int, event: ev.Placed) -> InstanceFields:
    return InstanceFields(
        instance_id=subject,
        spec=event.spec,
        placed_by=event.placed_by,
        generation=event.generation,
        lifecycle=S.RESTING if event.spec.get("on_demand") else S.LOADED,
        desired=Desired.STOPPED,
        since_ns=ts_ns,
        last_seq=seq,
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


def _target(inst: InstanceFields, event: ev.InstanceEvent) -> LifecycleState | None:
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


# What each kind of event changes besides the transition. Each handler reads the
# record as the event found it before it writes (the rules are of the state before).


#: Whose start is a use of the instance (issue 21): a caller's verb. A request's
#: start is one by its ``residency.demanded``; the node's own (a restart after an
#: exit, a boot's resume of a running instance) is not.
_USERS = frozenset({Role.OPERATOR, Role.CONTROLLER})


def _on_starting(w: InstanceFields, ts_ns: int, e: ev.Starting) -> None:
    if w.demanded or role_of(e.by) in _USERS:
        w.last_use_ns = ts_ns
    w.demanded, w.rested_for, w.refused_ns = False, "", None
    if e.reset_budget:
        w.restarts, w.restart_times_ns, w.restart_stamps = 0, (), ()
    w.desired = Desired.RUNNING
    w.process = w.restart_due = w.terminating = w.up_since = None
    w.launch_token = e.launch_token
    w.then = Then.NOTHING
    w.then_by = w.refusal = w.unload_error = w.stopped_by = ""
    w.reserved_bytes = e.reserved_bytes


def _on_spawned(w: InstanceFields, ts_ns: int, e: ev.Spawned) -> None:
    w.process = ProcessRecord(pid=e.pid, pgid=e.pgid, start_time=e.start_time, boot_id=e.boot_id)
    w.up_since = e.at


def _on_reattached(w: InstanceFields, ts_ns: int, e: ev.Reattached) -> None:
    w.up_since = e.up_since or w.up_since


def _on_exited(w: InstanceFields, ts_ns: int, e: ev.Exited) -> None:
    w.last_exit = ExitRecord(
        pid=e.pid,
        exit_code=e.exit_code,
        signal=e.signal,
        reason=e.reason,
        ts_ns=ts_ns,
        output_tail=e.output_tail,
        oom_killed=e.oom_killed,
    )
    if e.oom_killed:
        w.oom_kills += 1
    w.process = w.terminating = w.up_since = None
    w.reserved_bytes = 0


def _on_restart(w: InstanceFields, ts_ns: int, e: ev.RestartScheduled) -> None:
    w.restarts += 1
    w.restart_times_ns = (*w.restart_times_ns, ts_ns)
    if e.at is not None:
        w.restart_stamps = (*w.restart_stamps, e.at)
    w.restart_due = e.due


def _on_held(w: InstanceFields, ts_ns: int, e: ev.InstanceEvent) -> None:
    w.desired, w.restart_due, w.then = Desired.STOPPED, None, Then.NOTHING


def _on_stable(w: InstanceFields, ts_ns: int, e: ev.StableAgain) -> None:
    w.restarts, w.restart_times_ns, w.restart_stamps = 0, (), ()


def _on_exposed(w: InstanceFields, ts_ns: int, e: ev.Exposed) -> None:
    _on_held(w, ts_ns, e)
    w.exposed = tuple(e.addresses)


def _on_replaced(w: InstanceFields, ts_ns: int, e: ev.Replaced) -> None:
    w.placed_by, w.generation = e.placed_by, e.generation


def _on_stop(w: InstanceFields, ts_ns: int, e: ev.StopRequested) -> None:
    keeps_wanted = e.by == Role.SHUTDOWN or e.then == Then.RESTART
    if w.process is not None and e.at is not None:
        why = f" ({e.reason})" if e.reason else ""
        w.terminating = Termination(
            cause=f"stopped by {e.by}{why}", grace_s=e.grace_s, by=e.by, at=e.at
        )
    if not (e.by == Role.SHUTDOWN and not e.then):  # a shutdown leaves a pending restart pending
        w.then, w.then_by = e.then, e.by
    held_by = "" if keeps_wanted or e.then == Then.REST else e.by
    w.stopped_by = held_by or (w.stopped_by if keeps_wanted else "")
    if e.then != Then.REST and not keeps_wanted:
        w.rested_for = ""  # an operator's stop: it no longer rests for a reason of its own
    if not keeps_wanted:
        w.desired, w.demanded = Desired.STOPPED, False  # a stop ends a demand not yet started
        w.refusal = ""  # a refused start's cause is no longer what the instance waits on
    if not w.then:
        w.then_by = ""
    w.restart_due = None
    w.unload_error = ""


def _on_terminating(w: InstanceFields, ts_ns: int, e: ev.Terminating) -> None:
    w.terminating = Termination(cause=e.cause, grace_s=e.grace_s, by=Role.SUPERVISOR, at=e.at)


def _on_ready(w: InstanceFields, ts_ns: int, e: ev.Ready) -> None:
    w.up_since = w.up_since or e.at


def _on_refused(w: InstanceFields, ts_ns: int, e: ev.StartRefused) -> None:
    """A refused start keeps its cause; one a demand asked for ends the demand (the
    next request asks again), so no boot resumes a request that failed long ago."""
    _end_demand(w)
    w.refusal = e.reason


def _end_demand(w: InstanceFields) -> None:
    """A demand recorded and not started is refused: no longer wanted running."""
    if w.demanded and w.lifecycle not in LIVE_STATES:
        w.desired = Desired.STOPPED
    w.demanded = False


def _on_claimed(w: InstanceFields, ts_ns: int, e: ev.ModelClaimed) -> None:
    w.ollama_owned = e.ours


def _on_dropped(w: InstanceFields, ts_ns: int, e: ev.ModelDropped) -> None:
    w.ollama_owned = False


def _on_corrected(w: InstanceFields, ts_ns: int, e: ev.MemoryCorrected) -> None:
    w.reserved_bytes = e.reserved_bytes


def _on_released(w: InstanceFields, ts_ns: int, e: ev.MemoryReleased) -> None:
    w.reserved_bytes = 0


def _on_unload_failed(w: InstanceFields, ts_ns: int, e: ev.UnloadFailed) -> None:
    w.unload_error = e.error


def _on_demanded(w: InstanceFields, ts_ns: int, e: rev.ResidencyDemanded) -> None:
    """Wanted running until its start (the use: ``instance.starting``) or refusal."""
    w.desired, w.demanded = Desired.RUNNING, True


def _on_room_refused(w: InstanceFields, ts_ns: int, e: rev.ResidencyRefused) -> None:
    """The start that asked is refused: a demand recorded for it ends; the refusal
    and its time are kept (identical ones soon after record nothing more)."""
    _end_demand(w)
    w.refusal = no_room(e.needed_bytes, e.in_use_bytes, e.budget_bytes)
    w.refused_ns = ts_ns


def _on_evicted(w: InstanceFields, ts_ns: int, e: rev.ResidencyEvicted) -> None:
    w.rested_for = f"evicted for {e.for_instance}"


def _on_expired(w: InstanceFields, ts_ns: int, e: rev.ResidencyExpired) -> None:
    w.rested_for = f"idle longer than {seconds(e.idle_ttl_s)}"


def _on_busy(w: InstanceFields, ts_ns: int, e: rev.ResidencyBusy) -> None:
    w.busy, w.last_use_ns = True, ts_ns


def _on_idle(w: InstanceFields, ts_ns: int, e: rev.ResidencyIdle) -> None:
    w.busy, w.last_use_ns = False, e.idle_since_ns


_Handler = Callable[[InstanceFields, int, Any], None]

_UPDATES: dict[type[Any], _Handler] = {
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
    rev.ResidencyDemanded: _on_demanded,
    rev.ResidencyRefused: _on_room_refused,
    rev.ResidencyEvicted: _on_evicted,
    rev.ResidencyExpired: _on_expired,
    rev.ResidencyBusy: _on_busy,
    rev.ResidencyIdle: _on_idle,
}

_Rule = tuple[LifecycleState | None, bool, bool, _Handler | None, Callable[[Any], str]]

#: Per instance event type, in one lookup: the state it moves to (None: no move),
#: whether that depends on the state it meets (`_target`), whether it re-enters
#: its own state, what else it changes (`_UPDATES`) and the reason it records.
RULES: dict[type[Any], _Rule] = {
    t: (
        _FIXED_TARGETS.get(t),
        t in _DEPENDENT_TARGETS,
        t is ev.RestartScheduled,
        _UPDATES.get(t),
        REASONS[t],
    )
    for t in INSTANCE_TYPES
    if t not in (ev.Placed, ev.Unloaded)
}
