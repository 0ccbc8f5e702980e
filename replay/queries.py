"""Audit and forensic queries over a chain: rebuild, timeline, verified reads.

Read-only: these open the chain with its own reader connection.
`read_chain` is what the offline command line uses: it verifies the chain
and replays it in one pass over one snapshot (`infervisor.chain.scan_chain`),
optionally only up to a sequence number or a time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import msgspec

from infervisor.chain import SqliteChain, StoredEvent, VerifyReport, scan_chain
from infervisor.chain.verify import Batch, Verified

from . import events as ev
from .reducer import Folder, apply_instance, fold, reason_of
from .state import InstanceState, NodeState

__all__ = ["ChainRead", "TimelineEntry", "read_chain", "rebuild", "timeline", "timeline_of"]


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


class ChainRead(msgspec.Struct, frozen=True, kw_only=True):
    """What `read_chain` read: the state, the verdict on the whole chain, what was kept.

    Attributes:
        state: the node state after the last event replayed.
        report: the verification of the whole chain, read in the same snapshot.
        replayed: how many events were replayed (fewer than the chain's with
            `until_seq` / `until_ns`).
        by_subject: with `keep_events`, every replayed event by subject, in seq order.
    """

    state: NodeState
    report: VerifyReport
    replayed: int
    by_subject: dict[str, list[StoredEvent]] = msgspec.field(default_factory=dict)


def read_chain(
    path: str | os.PathLike[str],
    *,
    until_seq: int | None = None,
    until_ns: int | None = None,
    unverified: bool = False,
    keep_events: bool = False,
) -> ChainRead:
    """Verify and replay the chain at `path` in one pass over one snapshot.

    Only rows that checked out are replayed, unless `unverified` (then the
    rows after the first problem are replayed as stored, and `report` says
    what is wrong). With `until_seq`, events after that seq are not
    replayed; with `until_ns` (ns since the Unix epoch, UTC), replay stops
    before the first event stamped later (the chain's order is its seq, and
    clocks may step back: this is the state as the chain stood at that
    time). Verification covers the whole chain either way.

    Raises:
        ChainFormatError, ChainIOError: the file is not a readable chain.
        ReplayError, EventDecodeError: an event that checked out does not fit
            the state (or, `unverified`, one that did not).
    """
    folder = Folder("")
    feed = folder.feed
    kept: dict[str, list[StoredEvent]] = {}
    count = 0
    done = False

    def consume(stored: StoredEvent) -> None:
        nonlocal count, done
        if done:
            return
        if (until_seq is not None and stored.seq > until_seq) or (
            until_ns is not None and stored.ts_ns > until_ns
        ):
            done = True
            return
        feed(stored)
        count += 1
        if keep_events:
            kept.setdefault(stored.subject, []).append(stored)

    if not keep_events:
        # The scan's rows in lists to the folder, without a StoredEvent each.
        batch = _up_to(folder.feed_rows, until_seq, until_ns)
        report = scan_chain(path, keep_going=unverified, batch=batch)
        count = folder.head_seq + 1
    else:
        report = scan_chain(path, consume, keep_going=unverified)
    node = report.node or ""
    return ChainRead(state=folder.state(node), report=report, replayed=count, by_subject=kept)


def _up_to(feed: Batch, until_seq: int | None, until_ns: int | None) -> Batch:
    """`feed` of the rows up to the first after `until_seq` or stamped after `until_ns`
    (`read_chain`'s cut); none after it."""
    if until_seq is None and until_ns is None:
        return feed
    last_seq = until_seq if until_seq is not None else math.inf
    last_ns = until_ns if until_ns is not None else math.inf
    done = False

    def take(rows: list[Verified]) -> None:
        nonlocal done
        if done:
            return
        for i, row in enumerate(rows):
            if row[0] > last_seq or row[1] > last_ns:
                done, rows = True, rows[:i]
                break
        feed(rows)

    return take


def timeline_of(stored_events: list[StoredEvent]) -> list[TimelineEntry]:
    """The timeline entries of one instance's events (as `timeline` gives them)."""
    return list(_timeline(iter(stored_events)))


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
