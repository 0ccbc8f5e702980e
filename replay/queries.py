"""Audit and forensic queries over a chain: rebuild, timeline.

Read-only: these open the chain with its own reader connection.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec

from infervisor.chain import SqliteChain, StoredEvent

from . import events as ev
from .reducer import apply_instance, fold, reason_of
from .state import InstanceState, NodeState

__all__ = ["TimelineEntry", "rebuild", "timeline"]


class TimelineEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One line of an instance's history. ``frm``/``to`` are equal when no state changed;
    ``frm`` is encoded as ``from`` (a Python keyword, hence the attribute's name)."""

    seq: int
    ts_ns: int
    kind: str
    source: str
    frm: str = msgspec.field(name="from")
    to: str
    reason: str


def rebuild(path: str | os.PathLike[str]) -> NodeState:
    """The node state rebuilt from the chain file alone."""
    with SqliteChain.open_readonly(path) as chain:
        return fold(chain.node_id, chain.events())


def timeline(path: str | os.PathLike[str], instance_id: str) -> list[TimelineEntry]:
    """Every event of one instance, with the lifecycle state before and after it."""
    with SqliteChain.open_readonly(path) as chain:
        return list(_timeline(chain.events(subject=instance_id)))


def _timeline(stored_events: Iterator[StoredEvent]) -> Iterator[TimelineEntry]:
    inst: InstanceState | None = None
    for stored in stored_events:
        event = ev.decode_event(stored)
        if not isinstance(event, ev.InstanceEvent):
            continue
        before = inst.lifecycle.value if inst else "-"
        inst = apply_instance(inst, stored, event)
        after = inst.lifecycle.value if inst else "-"
        yield TimelineEntry(
            seq=stored.seq,
            ts_ns=stored.ts_ns,
            kind=stored.kind,
            source=stored.source,
            frm=before,
            to=after,
            reason=reason_of(event),
        )
