"""Residency per node (issue 21): which instances a start that does not fit
evicts, whoever asked for it (a request, an operator's or controller's verb, a
start the node decided itself). Pure; the node gathers each instance's facts
(:func:`holder`) and executes the plan (actors/node_residency.py). The least
recently used of those :data:`EVICTABLE` allows go first; all of them or none
(evicting some that cannot make room would unload for nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from infervisor.replay import Desired, InstanceState, LifecycleState
from infervisor.replay import residency_events as rev

from .rules import Rules

__all__ = ["EVICTABLE", "PASSING", "Holder", "RoomPlan", "busy_named", "holder", "plan_room"]

S = LifecycleState
#: What may be evicted: serving, nothing loading.
_SERVING = frozenset({S.RUNNING, S.UNHEALTHY})


def holder(inst: InstanceState, rules: Rules, serving: int, model_bytes: int) -> Holder:
    """What an eviction weighs of this instance (``model_bytes``: its model's size)."""
    kind = rules.supervision
    return Holder(
        instance_id=inst.instance_id,
        held_bytes=inst.reserved_bytes,
        last_use_ns=inst.last_use_ns,
        priority=rules.priority,
        pinned=rules.pinned,
        busy=serving > 0,
        loading=inst.lifecycle is S.STARTING,
        serving=inst.lifecycle in _SERVING and inst.desired is Desired.RUNNING,
        needs_bytes=model_bytes + rules.reserve_overhead_bytes,
        startup_s=max(kind.startup_cap_s, kind.startup_deadline_s),
        releasing=inst.lifecycle is S.STOPPING and inst.reserved_bytes > 0,
    )


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """What an eviction weighs of one instance (gathered by the node from its actor).

    Attributes:
        instance_id: the instance.
        held_bytes: what it holds in the ledger, bytes.
        last_use_ns: its last use (sourced; None: never).
        priority: its spec's priority.
        pinned: never evicted.
        busy: serving a request now.
        loading: starting (a server loading its model).
        serving: running or unhealthy (only these hold memory to give back).
        needs_bytes: what a start of it reserves (model plus overhead), bytes.
        startup_s: how long its kind lets it start (the start-up cap), seconds
            (0: the kind sets none).
        releasing: stopping while it holds memory (an eviction or expiry in
            flight, or one a boot resumes): its memory is on its way back, so a
            plan waits for it before it evicts or refuses anything.
    """

    instance_id: str
    held_bytes: int
    last_use_ns: int | None
    priority: int
    pinned: bool
    busy: bool
    loading: bool
    serving: bool
    needs_bytes: int = 0
    startup_s: float = 0.0
    releasing: bool = False


#: Why a holder may not be evicted for a start of priority ``p``, in order:
#: the first that applies is recorded as its ``why_not``.
EVICTABLE: tuple[tuple[str, Callable[[Holder, int], bool]], ...] = (
    ("pinned", lambda h, p: h.pinned),
    ("higher priority", lambda h, p: h.priority > p),
    ("serving a request", lambda h, p: h.busy),
    ("loading", lambda h, p: h.loading),
    ("not serving", lambda h, p: not h.serving),
)


class RoomPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a start that needs ``needed_bytes`` calls for.

    Attributes:
        victims: the instances to evict, in order (empty: it fits, or refused).
        candidates: every holder weighed, least recently used first.
        freed_bytes: what the victims free, bytes.
        in_use_bytes: what the others hold, bytes.
        refusal: why nothing can make room (None: it fits, or the victims do).
        wait_for: with a refusal, the holders barred only for now (serving a
            request or loading, least recently used first) whose end, beside
            the victims allowed, would make room: a demand may wait for them
            (empty: nothing will make room by itself; refuse at once).
    """

    victims: tuple[str, ...] = ()
    candidates: tuple[rev.Candidate, ...] = ()
    freed_bytes: int = 0
    in_use_bytes: int = 0
    refusal: str | None = None
    wait_for: tuple[str, ...] = ()


#: The bars of :data:`EVICTABLE` that lift by themselves (a request ends, a load ends).
PASSING = frozenset({"serving a request", "loading"})


def _lru_key(h: Holder) -> tuple[int, str]:
    return (h.last_use_ns or 0, h.instance_id)


def plan_room(
    for_instance: str,
    needed_bytes: int,
    budget_bytes: int,
    priority: int,
    holders: Iterable[Holder],
) -> RoomPlan:
    """Which instances to evict so that ``needed_bytes`` fit ``budget_bytes`` beside
    what the others hold (pure). The least recently used of those
    :data:`EVICTABLE` allows go first, until it fits; when all of them are not
    enough, none goes and the plan is refused with the numbers."""
    others = sorted((h for h in holders if h.instance_id != for_instance), key=_lru_key)
    in_use = sum(h.held_bytes for h in others)
    if in_use + needed_bytes <= budget_bytes:
        return RoomPlan(in_use_bytes=in_use)
    victims: list[str] = []
    freed = 0
    why: dict[str, str] = {}
    for h in others:
        reason = next((name for name, bars in EVICTABLE if bars(h, priority)), "")
        if h.held_bytes <= 0:
            reason = reason or "holds nothing"
        why[h.instance_id] = reason
        if reason or in_use - freed + needed_bytes <= budget_bytes:
            continue
        victims.append(h.instance_id)
        freed += h.held_bytes
    fits = in_use - freed + needed_bytes <= budget_bytes
    chosen = set(victims) if fits else set()
    candidates = tuple(
        rev.Candidate(
            instance_id=h.instance_id,
            last_use_ns=h.last_use_ns,
            priority=h.priority,
            pinned=h.pinned,
            held_bytes=h.held_bytes,
            busy=h.busy,
            chosen=h.instance_id in chosen,
            why_not=why[h.instance_id],
        )
        for h in others
        if h.held_bytes > 0
    )
    if fits:
        return RoomPlan(
            victims=tuple(victims), candidates=candidates, freed_bytes=freed, in_use_bytes=in_use
        )
    return RoomPlan(
        candidates=candidates,
        in_use_bytes=in_use,
        refusal=(
            f"memory budget {budget_bytes} bytes, {in_use} in use, {needed_bytes} needed: "
            f"evicting every instance that may go frees {freed}, not enough"
        ),
        wait_for=_wait_for(others, why, in_use - freed + needed_bytes - budget_bytes),
    )


def _wait_for(others: list[Holder], why: dict[str, str], short_bytes: int) -> tuple[str, ...]:
    """The fewest holders barred only for now (:data:`PASSING`, least recently
    used first) whose bytes cover ``short_bytes``; empty when all of them do not."""
    waited: list[str] = []
    for h in others:
        if short_bytes <= 0:
            break
        if why[h.instance_id] in PASSING and h.held_bytes > 0:
            waited.append(h.instance_id)
            short_bytes -= h.held_bytes
    return tuple(waited) if short_bytes <= 0 else ()


def busy_named(candidates: Iterable[rev.Candidate]) -> str:
    """The candidates that could not go, each with why (``a (serving a request),
    b (pinned)``), for a refusal's message; empty when there are none."""
    return ", ".join(f"{c.instance_id} ({c.why_not})" for c in candidates if c.why_not)
