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
from infervisor.chain.verify import Verified, stored_of

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
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_TAGS: dict[type[Any], str] = {t: tag for tag, t in ev.EVENT_TYPES.items()}
_INSTANCE, _NODE_STARTED, _LEASE = INSTANCE_TYPES, ev.NodeStarted, ev.LeaseRenewed


class _Unread(msgspec.Struct, frozen=True):
    """What `Folder.feed_rows` holds for a payload its one typed decode did not read
    (no current version: `v` is 0); `decode_event` then names the problem or upcasts."""

    v: int = 0


_UNREAD = _Unread()


class Folder:
    """`apply` for a whole chain without a new `NodeState` per event.

    Feed it the stored events in seq order (`feed`, usable as the consumer
    of `infervisor.chain.scan_chain`, or `feed_rows`, its batch consumer),
    then read `state()`. The result is what folding the same events with
    `apply` gives; the instances are kept in one dict of changeable records,
    which only this object sees.
    """

    __slots__ = (
        "_base", "_booting", "_boots", "_cordon", "_down_ns", "_head_ns", "_instances",
        "_lease", "_leases", "_next", "_node_id", "_sets", "_top", "_why",
    )  # fmt: skip

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        #: The seq and hash of the last event fed (None: none yet).
        self._top: tuple[int, bytes] | None = None
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
        return self._base[0] if self._top is None else self._top[0]

    def feed(self, stored: StoredEvent) -> None:
        """Fold one event. Raises as `apply` does (ReplayError, EventDecodeError)."""
        self.feed_rows(
            [
                (
                    stored.seq,
                    stored.ts_ns,
                    stored.source,
                    stored.kind,
                    stored.subject,
                    stored.payload,
                    stored.payload_hash,
                    stored.prev_hash,
                    stored.hash,
                )
            ]
        )

    def feed_rows(self, rows: list[Verified]) -> None:
        """Fold events given as `Verified` tuples (the batch consumer of
        `infervisor.chain.scan_chain`), in seq order, as `feed` folds each.

        Raises:
            ReplayError, EventDecodeError: as `apply`; the events before the one
                refused are folded, and the folder stands at it (as after `feed`).
        """
        instances, why, nxt, step = self._instances, self._why, self._next, advance
        head_ns, booting = self._head_ns, self._booting
        top: Verified | None = None
        try:
            for row in rows:
                seq, ts_ns, _, name, subject, payload, _, _, _ = row
                if seq != nxt:
                    raise ReplayError(f"seq {seq} applied after {nxt - 1}: not the next event")
                nxt, top = seq + 1, row
                try:  # decode_event's common case: a current payload of the header's kind
                    event: Any = _DECODE(payload)
                except _DECODE_ERRORS:
                    event = _UNREAD
                if event.v != 1 or _TAGS[type(event)] != name:
                    if name == GENESIS_KIND:
                        continue
                    event = _decode(stored_of(row, self._node_id))  # names it, or upcasts
                kind = type(event)
                if kind in _INSTANCE:  # no boot (RunClock.after, as plain values)
                    head_ns, booting = ts_ns, False
                    work = instances.get(subject)
                    updated = step(work, event, seq, ts_ns, name, subject, why)
                    if updated is None:
                        instances.pop(subject, None)
                        why.pop(subject, None)
                    elif updated is not work:
                        instances[subject] = updated
                else:
                    self._head_ns, self._booting = head_ns, booting
                    self._node_event(kind, event, ts_ns)
                    head_ns, booting = self._head_ns, self._booting
        finally:
            self._next, self._head_ns, self._booting = nxt, head_ns, booting
            if top is not None:
                self._top = (top[0], top[8])

    def _node_event(self, kind: type[Any], event: Any, ts_ns: int) -> None:
        """Fold an event of the node (not of one instance) at `ts_ns`."""
        boot = kind in BOOT_TYPES
        if boot and not self._booting and self._head_ns:
            self._down_ns += max(0, ts_ns - self._head_ns)
        self._head_ns, self._booting = ts_ns, boot
        if kind is _NODE_STARTED:
            self._boots += 1
        elif kind is _LEASE:
            self._lease = LeaseRecord(
                controller=event.controller, at=event.at, down_ns=self._down_ns
            )
            self._leases[event.controller] = self._lease
        elif kind in NODE_SET_TYPES:
            self._cordon, self._sets = node_sets(self._cordon, self._sets, event)

    def state(self, node_id: str = "") -> NodeState:
        """The node state after the events fed so far (`node_id` overrides the one given)."""
        top, why = self._top, self._why
        return NodeState(
            node_id=node_id or self._node_id,
            head_seq=self._base[0] if top is None else top[0],
            head_hash=self._base[1] if top is None else top[1].hex(),
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
