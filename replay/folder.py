"""Replay of a whole chain: `Folder` folds stored events one by one into the node
state without a new `NodeState` (or `InstanceState`) per event; `fold` runs it
over a chain from its genesis.

The result is what `replay.reducer.apply` gives one event at a time (the same
rules: replay/instance_rules.py `advance`); the instances are changeable
records (`InstanceFields`) that only the folder sees, frozen when a state is
asked for. bench/chain_audit.py measures it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent

from . import events as ev
from .instance_rules import INSTANCE_TYPES, Pending, ReplayError, advance, settle
from .node_sets import NODE_SET_TYPES, node_sets
from .state import (
    Cordon,
    InstanceFields,
    InstanceState,
    LeaseRecord,
    NodeState,
    RunClock,
    freeze,
    thaw,
)

__all__ = ["BOOT_TYPES", "Folder", "fold"]

#: The events that open a run (the first of them ends the node's downtime).
BOOT_TYPES = frozenset({ev.NodeStarted, ev.WitnessOverride})
_decode = ev.decode_event
_DECODE = msgspec.json.Decoder(ev.Event).decode
_TAGS: dict[type[Any], str] = {t: tag for tag, t in ev.EVENT_TYPES.items()}
_INSTANCE, _NODE_STARTED, _LEASE = INSTANCE_TYPES, ev.NodeStarted, ev.LeaseRenewed


class Folder:
    """`apply` for a whole chain without a new `NodeState` per event.

    Feed it the stored events in seq order (`feed`, usable as the consumer
    of `infervisor.chain.scan_chain`), then read `state()`. The result is
    what folding the same events with `apply` gives; the instances are kept
    in one dict of changeable records, which only this object sees.
    """

    __slots__ = (
        "_base", "_booting", "_boots", "_cordon", "_down_ns", "_head", "_head_ns", "_instances",
        "_lease", "_leases", "_next", "_node_id", "_sets", "_why",
    )  # fmt: skip

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._head: StoredEvent | None = None
        #: The head (seq, hash hex) of the state resumed from, until an event is fed.
        self._base: tuple[int, str] = (-1, "")
        self._next = 0
        self._instances: dict[str, InstanceFields] = {}
        self._boots = 0
        self._head_ns = self._down_ns = 0
        self._booting = False
        self._lease: LeaseRecord | None = None
        self._leases: dict[str, LeaseRecord] = {}
        self._cordon = Cordon.NONE
        self._sets: dict[str, int] = {}
        #: Reasons not formatted yet (instance_rules.advance's `pending`): one per
        #: instance, settled when its state is asked for.
        self._why: Pending = {}

    @classmethod
    def resume(cls, state: NodeState) -> Folder:
        """A folder holding `state` (a snapshot's: replay/snapshot.py), to be fed
        the events after ``state.head_seq``; ``state()`` gives `state` back until then."""
        folder = cls(state.node_id)
        folder._base = (state.head_seq, state.head_hash)
        folder._next = state.head_seq + 1
        folder._instances = {iid: thaw(inst) for iid, inst in state.instances.items()}
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
        work = self._instances.get(instance_id)
        return None if work is None else freeze(settle(work, self._why))

    @property
    def head_seq(self) -> int:
        """Seq of the last event fed (-1 before genesis)."""
        return self._base[0] if self._head is None else self._head.seq

    def feed(self, stored: StoredEvent) -> None:
        """Fold one event. Raises as `apply` does (ReplayError, EventDecodeError)."""
        seq, name = stored.seq, stored.kind
        if seq != self._next:
            raise ReplayError(f"seq {seq} applied after {self._next - 1}: not the next event")
        self._next = seq + 1
        self._head = stored
        if name == GENESIS_KIND:
            return
        try:  # decode_event's common case, inlined: a current payload of the header's kind
            event: ev.Event = _DECODE(stored.payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            event = _decode(stored)  # names the problem, or upcasts
        else:
            if event.v != 1 or _TAGS[type(event)] != name:
                event = _decode(stored)
        kind = type(event)
        if kind in _INSTANCE:  # the common case: no boot (RunClock.after, as plain values)
            self._head_ns, self._booting = stored.ts_ns, False
            instances, subject = self._instances, stored.subject
            work = instances.get(subject)
            updated = advance(work, stored, event, self._why)  # type: ignore[arg-type]
            if updated is None:
                instances.pop(subject, None)
                self._why.pop(subject, None)
            elif updated is not work:
                instances[subject] = updated
            return
        boot = kind in BOOT_TYPES
        if boot and not self._booting and self._head_ns:
            self._down_ns += max(0, stored.ts_ns - self._head_ns)
        self._head_ns, self._booting = stored.ts_ns, boot
        if kind is _NODE_STARTED:
            self._boots += 1
        elif kind is _LEASE:
            assert isinstance(event, ev.LeaseRenewed)
            self._lease = LeaseRecord(
                controller=event.controller, at=event.at, down_ns=self._down_ns
            )
            self._leases[event.controller] = self._lease
        elif kind in NODE_SET_TYPES:
            self._cordon, self._sets = node_sets(self._cordon, self._sets, event)

    def state(self, node_id: str = "") -> NodeState:
        """The node state after the events fed so far (`node_id` overrides the one given)."""
        head, why = self._head, self._why
        return NodeState(
            node_id=node_id or self._node_id,
            head_seq=self._base[0] if head is None else head.seq,
            head_hash=self._base[1] if head is None else head.hash.hex(),
            instances={iid: freeze(settle(work, why)) for iid, work in self._instances.items()},
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
