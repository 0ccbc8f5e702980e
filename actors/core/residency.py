"""Residency (issue 21): what is loaded within the node's memory budget, decided
from sourced facts. Pure, as the rest of the core.

Two parts:

- **Per instance** (:func:`rules_with`, merged into each managed mode's table): a
  demand (a request) starts a resting instance; its start's memory check
  answers ``no room`` to the node rather than recording a refusal, as a start
  or restart verb's does when the node sends it (``room``). The start, once
  made, is recorded with ``residency.demanded`` (the use) in its own
  transaction; when the node evicts for it, ``residency.demanded`` is recorded
  first (``RoomPlanned``: a boot resumes it). The node's eviction of an
  instance (``residency.evicted`` with a stop whose ``then`` is ``rest``, in one
  transaction) unless it turned busy or is loading; the node's refusal
  (``residency.refused``, at most one per window for identical ones); requests
  beginning and ending (``residency.busy`` at once, ``residency.idle`` at the
  next tick: debounced, not a row per request); and idle expiry on the tick
  (``residency.expired`` with a stop to rest) once ``idle_ttl_s`` has passed
  with nothing in flight.
- **Per node** (:func:`plan_room`): which instances a start that does not fit
  evicts, whoever asked for it (a request, an operator's or controller's
  verb). The least recently used first, of those :data:`EVICTABLE` allows;
  all of them or none (evicting some that cannot make room would unload for
  nothing).

==================  ====================================  ================================
observation         the instance is                        decided
==================  ====================================  ================================
demand              starting, running, unhealthy           nothing (it is, or becomes, ready)
demand              restarting, exited (wanted running)    nothing (the restart policy runs)
demand              failed                                 refused ``failed``
demand              stopped (by an operator/controller)    refused ``stopped``, naming who
demand              loaded (placed without a start)        refused ``stopped``, naming who placed it
demand              resting                                start checks (``residency.demanded``
                                                           with the start; no room: answered)
room planned        up, or demanded already                nothing
room planned        stopped, by a request                  refused ``stopped``, naming who
room planned        unloading, or stopped for exposure     refused (nothing recorded)
room planned        startable                              ``residency.demanded`` (wanted running)
evict               running, idle, not pinned              ``residency.evicted`` + stop to rest
evict               anything else                          refused (the node plans again)
room refused        refused the same, within the window    counted (metrics), refused no_room
room refused        otherwise                              ``residency.refused``, refused no_room
request began       idle as recorded                       ``residency.busy``
request began/ended otherwise                              tracking only
server activity     as request began/ended, counted by the server itself
tick                idle as counted, recorded busy         ``residency.idle``
tick                running, idle past idle_ttl_s          ``residency.expired`` + stop to rest
==================  ====================================  ================================

An operator's or controller's stop wins: a stopped instance is not started by
a request, only by a verb; so does a placement without a start (``loaded``, not
on demand): a request starts only an instance that rests by residency (evicted,
expired, or placed on demand: ``resting``). Last use is sourced (a start a
caller asked for: ``instance.starting`` by an operator or controller, or after
``residency.demanded``; ``residency.busy``, ``.idle``), so eviction order and
expiry are decided the same after a boot; a refused start is no use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import residency_events as rev
from infervisor.replay.callers import Role
from infervisor.replay.durations import seconds
from infervisor.replay.state import Then

from . import observations as o
from .common import (
    STARTABLE,
    demand_pending,
    remaining_s,
    scheduled_attempt,
    try_start,
    unloading,
)
from .decision import Draft, RefusalKind, Rule
from .room import EVICTABLE, PASSING, Holder, RoomPlan, busy_named, holder, plan_room
from .rules import Tracking

__all__ = [
    "EVICTABLE",
    "PASSING",
    "Holder",
    "RoomPlan",
    "Stop",
    "holder",
    "idle_since_ns",
    "plan_room",
    "rules_with",
    "server_activity",
    "start_again",
]

S = LifecycleState
#: A mode's stop: ``stop(draft, by, grace_s, reason, then)`` (verbs.Stop).
Stop = Callable[[Draft, str, float, str, Then], None]
_UP = frozenset({S.STARTING, S.RUNNING, S.UNHEALTHY})
#: Recovering under the supervisor: a demand waits for it.
_COMING_BACK = frozenset({S.RESTARTING, S.EXITED})
#: What may be evicted or expired: serving, nothing loading.
_SERVING = frozenset({S.RUNNING, S.UNHEALTHY})


# ---------------------------------------------------------------- per instance
def demand(d: Draft, v: o.DemandVerb) -> None:
    """A request asks for the instance (see the module's table); one joins a start
    already demanded (allowed by whoever asked: a verb may start a stopped one)."""
    inst = d.inst
    if _on_its_way(inst):
        return
    refused = _refused(inst, by_request=not demand_pending(inst))
    if refused is not None:
        d.refuse(*refused)
        return
    # recorded with its start (a use), or answered "no room" for the node to plan
    try_start(d, v.by, verb=True, demand=True, request=v.request, model=v.model)


def room_planned(d: Draft, r: o.RoomPlanned) -> None:
    """The node evicts for this start: ``residency.demanded`` first (a boot resumes
    it), unless it is up or already demanded; a request's is refused when an
    operator or controller stopped the instance meanwhile (or it failed), and
    any is refused, nothing recorded, while the start itself would be held back
    (its Ollama unload in flight, or stopped for exposure): a demand recorded
    then would be one the live node never starts and a boot resumes."""
    inst = d.inst
    if _on_its_way(inst) or inst.lifecycle not in STARTABLE or demand_pending(inst):
        return
    refused = _refused(inst, by_request=not r.verb)
    if refused is not None:
        d.refuse(*refused)
        return
    d.emit(rev.ResidencyDemanded(request=r.request, model=r.model, by=r.by))


#: Where a start the node decided itself may be taken up again (a restart's or a
#: boot's: an exit is left to the restart policy, a failed instance to the operator).
_AGAIN = frozenset({S.LOADED, S.STOPPED, S.RESTARTING, S.RESTING})


def start_again(d: Draft, s: o.StartAgain) -> None:
    """The node made room for a start it decided itself (``AskRoom``): decide it
    again, as the reconcile tick would, unless it is no longer wanted (stopped,
    started meanwhile, demanded, held, or its restart not due yet). The start is
    the supervisor's or the boot's, as before: no use of the instance."""
    inst = d.inst
    restarting = inst.then == Then.RESTART
    if inst.lifecycle not in _AGAIN or inst.exposed or unloading(inst) or demand_pending(inst):
        return
    if inst.desired is not Desired.RUNNING and not restarting:
        return
    attempt = 0
    if inst.lifecycle is S.RESTARTING:
        due = inst.restart_due
        if inst.process is not None or (due is not None and remaining_s(due, d.now) > 1e-3):
            return  # its timer starts it when due
        attempt = scheduled_attempt(inst, d.rules.supervision.restart)
    by = (inst.then_by or s.by) if restarting else s.by
    try_start(d, by, attempt=attempt, demand=not s.record, planned=s.record)


def _refused(inst: InstanceState, *, by_request: bool) -> tuple[RefusalKind, str] | None:
    """Why a start asked for the instance is refused now (None: it may go on): a
    request's when it must not start it (:func:`_not_for_a_request`), and any
    while the start itself would be held back (:func:`_held_back`)."""
    refused = _not_for_a_request(inst) if by_request else None
    if refused is not None:
        return refused
    held = _held_back(inst)
    return None if held is None else (RefusalKind.INVALID_STATE, held)


def _not_for_a_request(inst: InstanceState) -> tuple[RefusalKind, str] | None:
    """Why a request must not start it (a verb may): failed, stopped, or busy stopping."""
    if inst.lifecycle is S.FAILED:
        return (
            RefusalKind.NOT_FAILED,
            f"{inst.instance_id} is failed ({inst.reason}): held for the operator; "
            "start it (infervisor start) once the cause is fixed",
        )
    refusal = _stopped_refusal(inst)
    if refusal is not None:
        return RefusalKind.NOT_STOPPED, refusal
    if inst.lifecycle is S.LOADED and inst.desired is not Desired.RUNNING:
        # placed without a start (not on demand): held as a stop is, for a verb to start
        return (
            RefusalKind.NOT_STOPPED,
            f"{inst.instance_id} was placed by {inst.placed_by or 'the node'} without a "
            "start (not on demand): a request does not start it; start it "
            "(infervisor start) or place it on demand to serve requests",
        )
    if inst.lifecycle not in STARTABLE:
        return (
            RefusalKind.INVALID_STATE,
            f"{inst.instance_id} is {inst.lifecycle}: ask again once it has stopped",
        )
    return None


def _on_its_way(inst: InstanceState) -> bool:
    """Up, or coming back under the supervisor: a start asked for waits for it."""
    if inst.lifecycle in _UP:
        return True
    return inst.lifecycle in _COMING_BACK and inst.desired is Desired.RUNNING


def _held_back(inst: InstanceState) -> str | None:
    """Why a demand cannot start it now though nobody stopped it (as a start verb)."""
    if inst.exposed:
        return (
            f"{inst.instance_id} was stopped for listening beyond loopback "
            f"({', '.join(inst.exposed)}); reload the instance"
        )
    if unloading(inst):
        return f"{inst.instance_id} is unloading its model: ask again once the unload has ended"
    return None


def _stopped_refusal(inst: InstanceState) -> str | None:
    """Why a demand must not start an instance an operator or controller stopped."""
    held = inst.lifecycle in (S.STOPPED, S.EXITED, S.FINISHED, S.STOPPING)
    if not held or inst.desired is Desired.RUNNING:
        return None
    who = inst.stopped_by or "the node"
    return (
        f"{inst.instance_id} was stopped by {who}: a request does not start it; "
        "start it (infervisor start) to serve requests again"
    )


def evict(d: Draft, v: o.EvictVerb, stop: Stop) -> None:
    """Evict for the node's plan: recorded with its stop to rest, in one
    transaction; refused when it is no longer evictable (busy, loading, pinned)."""
    inst = d.inst
    why = _not_evictable(inst, d.tracking.serving, d.rules.pinned)
    if why is not None:
        d.refuse(RefusalKind.INVALID_STATE, f"{inst.instance_id} is not evicted: {why}")
        return
    d.emit(
        rev.ResidencyEvicted(
            for_instance=v.for_instance,
            needed_bytes=v.needed_bytes,
            freed_bytes=v.freed_bytes,
            budget_bytes=v.budget_bytes,
            in_use_bytes=v.in_use_bytes,
            candidates=list(v.candidates),
            cause=v.cause,
        )
    )
    stop(d, v.by, v.grace_s, f"evicted for {v.for_instance}", Then.REST)


def _not_evictable(inst: InstanceState, inflight: int, pinned: bool) -> str | None:
    if pinned:
        return "it is pinned"
    if inflight > 0:
        return f"it serves {inflight} request(s)"
    if inst.lifecycle not in _SERVING or inst.desired is not Desired.RUNNING:
        return f"it is {inst.lifecycle}, not serving"
    return None


def room_refused(d: Draft, r: o.RoomRefused) -> None:
    """Nothing could be evicted: recorded with the ledger, the start refused (the
    instance keeps the refusal until a start, as a refused start's). One the same
    as the last recorded, within :data:`~rev.REFUSAL_WINDOW_S` of it and with no
    demand of it pending, is counted, not recorded (a front token holder cannot
    grow the chain by asking again)."""
    inst, tracking = d.inst, d.tracking
    if _folds(inst, r, d.now.wall_ns):
        d.track(
            msgspec.structs.replace(
                tracking,
                refusals_folded=tracking.refusals_folded + 1,
                refusals_folded_total=tracking.refusals_folded_total + 1,
            )
        )
    else:
        d.emit(
            rev.ResidencyRefused(
                needed_bytes=r.needed_bytes,
                budget_bytes=r.budget_bytes,
                in_use_bytes=r.in_use_bytes,
                held=dict(r.held),
                candidates=list(r.candidates),
                folded=tracking.refusals_folded,
            )
        )
        d.track(msgspec.structs.replace(tracking, refusals_folded=0))
    d.refuse(RefusalKind.NOT_NO_ROOM, _no_room_message(d.inst.instance_id, r))


def _no_room_message(iid: str, r: o.RoomRefused) -> str:
    """The refusal's text: the numbers, and what could not go and why (what was
    busy named), with how long the start waited for it."""
    named = busy_named(r.candidates) or "pinned, higher priority, serving or loading"
    waited = f"; waited {seconds(r.waited_s)} for one to turn idle" if r.waited_s > 0 else ""
    return (
        f"no room for {iid}: it needs {r.needed_bytes} bytes beside {r.in_use_bytes} in "
        f"use of the budget {r.budget_bytes}, and nothing can be evicted ({named}){waited}"
    )


def _folds(inst: InstanceState, r: o.RoomRefused, now_ns: int) -> bool:
    """An identical refusal soon after the last recorded one (see :func:`room_refused`)."""
    if inst.refused_ns is None or demand_pending(inst):
        return False
    same = inst.refusal == rev.no_room(r.needed_bytes, r.in_use_bytes, r.budget_bytes)
    return same and (r.node or now_ns - inst.refused_ns < rev.REFUSAL_WINDOW_S * 1e9)


def request_began(d: Draft, r: o.RequestBegan) -> None:
    """Count it; the first of a busy spell is recorded (``residency.busy``)."""
    d.track(msgspec.structs.replace(d.tracking, inflight=d.tracking.inflight + max(0, r.count)))
    if not d.inst.busy and d.inst.lifecycle in _SERVING:
        d.emit(rev.ResidencyBusy())


def request_ended(d: Draft, r: o.RequestEnded) -> None:
    """Count it; the idle spell begins when none is left (recorded at the next tick)."""
    before = d.tracking.serving
    left = max(0, d.tracking.inflight - max(0, r.count))
    counted = msgspec.structs.replace(d.tracking, inflight=left)
    _count(d, counted, before)


def server_activity(d: Draft, a: o.ServerActivity) -> None:
    """The server's own count of requests in progress: busy as for routed ones."""
    before = d.tracking.serving
    _count(d, msgspec.structs.replace(d.tracking, server_active=max(0, a.active)), before)


def _count(d: Draft, counted: Tracking, before: int) -> None:
    """Take the new counts: the first request of a busy spell is recorded, the
    moment the last one ended is kept for the next tick's ``residency.idle``."""
    if counted.serving == 0 and before > 0:
        counted = msgspec.structs.replace(counted, ended_ns=d.now.wall_ns)
    d.track(counted)
    # A count that arrives after the server stopped (a probe's late reading) is no
    # busy spell: the spell ended when its process did (replay/instance_rules.py).
    if counted.serving > 0 and not d.inst.busy and d.inst.lifecycle in _SERVING:
        d.emit(rev.ResidencyBusy())


def idle_since_ns(inst: InstanceState) -> int:
    """When the instance's idle spell began, ns since the epoch: its last use, or
    the moment it became ready (or entered its state) when it was never used
    since it started."""
    up = inst.up_since.wall_ns if inst.up_since is not None else inst.since_ns
    return max(inst.last_use_ns or 0, up)


def tick(d: Draft, stop: Stop) -> None:
    """Record an idle spell that began (debounced to the tick); release an
    instance idle past its ``idle_ttl_s`` to ``resting``."""
    inst, tracking = d.inst, d.tracking
    if tracking.serving == 0 and inst.busy:
        d.emit(rev.ResidencyIdle(idle_since_ns=tracking.ended_ns or d.now.wall_ns))
        inst = d.inst
    ttl = d.rules.idle_ttl_s
    if ttl is None or tracking.serving > 0 or inst.busy:
        return
    if inst.lifecycle is not S.RUNNING or inst.desired is not Desired.RUNNING:
        return
    since = idle_since_ns(inst)
    if d.now.wall_ns - since < ttl * 1e9:
        return
    d.emit(rev.ResidencyExpired(idle_since_ns=since, idle_ttl_s=ttl))
    stop(d, Role.SUPERVISOR, d.rules.stop_grace_s, f"idle longer than {seconds(ttl)}", Then.REST)


def rules_with(stop: Stop, mode_tick: Rule) -> dict[type[Any], Rule]:
    """The residency rules of a mode whose stop is ``stop``; its tick rule runs
    after residency's (an expiry's stop is then already recorded)."""

    def on_tick(d: Draft, t: o.Tick) -> None:
        tick(d, stop)
        mode_tick(d, t)

    def on_evict(d: Draft, v: o.EvictVerb) -> None:
        """Recorded with its stop to rest, in one transaction, unless it turned busy,
        is loading or pinned (then refused, and the node plans again)."""
        evict(d, v, stop)

    return {
        o.DemandVerb: demand,
        o.EvictVerb: on_evict,
        o.RoomRefused: room_refused,
        o.RoomPlanned: room_planned,
        o.StartAgain: start_again,
        o.RequestBegan: request_began,
        o.RequestEnded: request_ended,
        o.ServerActivity: server_activity,
        o.Tick: on_tick,
    }
