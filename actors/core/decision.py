"""A decision as data, and the draft a rule builds it in.

A rule emits events into a :class:`Draft`, which applies each one at once
with the replay reducer to a provisional state, so the next rule in the
same decision sees what the chain will say once the events are appended.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import msgspec

from infervisor.chain import StoredEvent
from infervisor.replay import InstanceState, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.state import Stamp

from .effects import Effect
from .rules import Rules, Tracking

__all__ = ["Decision", "Draft", "Refusal", "RefusalKind", "Rule", "Situation"]


class RefusalKind(enum.StrEnum):
    """Why a verb is answered with an error (the executor raises the matching one)."""

    INVALID_STATE = "invalid_state"  # the lifecycle state does not allow it
    REFUSED = "refused"  # never allowed for this kind (stop of an adopted server)
    ADMISSION = "admission"  # the address is taken, or an adopted server does not answer
    MEMORY = "memory"  # the memory budget does not fit it (with the numbers)
    SPAWN = "spawn"  # the program could not be launched (recorded as an exit)
    FAILED = "failed"  # the verb was accepted but its work failed
    NOT_STOPPED = "not_resident_stopped"  # a demand of an instance an operator stopped
    NOT_FAILED = "not_resident_failed"  # a demand of an instance held failed
    NOT_NO_ROOM = "not_resident_no_room"  # nothing could be evicted for its start


class Refusal(msgspec.Struct, frozen=True):
    """A verb's error: its kind and a message an operator can act on."""

    kind: RefusalKind
    message: str


class Situation(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a decision reads: sourced state, unsourced tracking, rules, now."""

    state: InstanceState
    tracking: Tracking
    rules: Rules
    now: Stamp


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """Events to append (in one transaction), then effects to run, in order.

    ``refusal`` answers the verb with an error (events may still be recorded:
    a refused start records why). ``tracking`` is the new unsourced state.
    """

    events: tuple[ev.InstanceEvent, ...] = ()
    effects: tuple[Effect, ...] = ()
    refusal: Refusal | None = None
    tracking: Tracking | None = None
    source: str = "supervisor"


class Draft:
    """Accumulates one decision; :attr:`state` is the state after the events so far.

    ``on_unload``: the effects the instance's mode runs once it is forgotten
    (``instance.unloaded``), after those added before it."""

    def __init__(
        self, sit: Situation, source: str = "supervisor", on_unload: tuple[Effect, ...] = ()
    ) -> None:
        self.sit = sit
        self.on_unload = on_unload
        self.source = source
        self.rules = sit.rules
        self.now = sit.now
        self.state: InstanceState | None = sit.state
        self.tracking = sit.tracking
        self.events: list[ev.InstanceEvent] = []
        self.effects: list[Effect] = []
        self.refusal: Refusal | None = None

    @property
    def inst(self) -> InstanceState:
        """The provisional state (the instance must not have been unloaded)."""
        assert self.state is not None
        return self.state

    def emit(self, event: ev.InstanceEvent) -> None:
        """Add an event and apply it provisionally (raises ReplayError if illegal)."""
        seq = self.inst.last_seq + 1
        stored = StoredEvent(
            seq=seq,
            ts_ns=self.now.wall_ns,
            node="",
            source=self.source,
            kind=kind_of(event),
            subject=self.inst.instance_id,
            payload=b"",
            payload_hash=b"",
            prev_hash=b"",
            hash=b"",
        )
        self.state = apply_instance(self.state, stored, event)
        self.events.append(event)
        if isinstance(event, ev.Unloaded):
            self.effects.extend(self.on_unload)  # the mode's clean-up (a process's workdir)
        if isinstance(event, ev.Starting) and self.tracking.deep_misses:
            # a new start counts deep health checks from zero
            self.tracking = msgspec.structs.replace(self.tracking, deep_misses=0)

    def do(self, *effects: Effect) -> None:
        """Add effects, run in order once the events are durable."""
        self.effects.extend(effects)

    def refuse(self, kind: RefusalKind, message: str) -> None:
        """Answer the verb with this error (the first refusal wins)."""
        if self.refusal is None:
            self.refusal = Refusal(kind, message)

    def track(self, tracking: Tracking) -> None:
        """Replace the unsourced tracking."""
        self.tracking = tracking

    def build(self) -> Decision:
        """The decision drafted so far."""
        return Decision(
            events=tuple(self.events),
            effects=tuple(self.effects),
            refusal=self.refusal,
            tracking=self.tracking,
            source=self.source,
        )


#: A rule: decides one observation into the draft (``rule(draft, observation)``).
Rule = Callable[[Draft, Any], None]
