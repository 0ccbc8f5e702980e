"""Mirror a node's event stream into the fleet store, checking each event's link.

The follower asks the node's watch stream (``GET /v1/events``, docs/api.md
"Watching the chain") for the events from one past the last seq it stored.
Each event is re-hashed from its fields (the payload re-encoded canonically:
chain/records.py ``encode_payload``) and checked against the stored event
before it with ``chain.checks.check_row`` (seq, payload hash, link, header
hash, genesis; docs/chain-format.md "Verification"), then stored and
committed before the next is read. A gap, a broken link or an event that
does not hash as it says is refused: it is recorded as a verification
failure (:meth:`FleetStore.record_failure`) and the follower stops at the
last good event (:class:`Refused`), so the store never holds an unchecked row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NoReturn

import msgspec

from infervisor.chain.checks import Row, check_row
from infervisor.chain.errors import ChainError
from infervisor.chain.hashing import payload_hash
from infervisor.chain.records import encode_payload

from ..api.errors import ApiError
from ..api.wire import WatchEvent
from .config import NodeEntry
from .node_api import FleetClient
from .store import FleetStore

__all__ = ["Diverged", "Refused", "diverged", "follow", "row_of"]


class Refused(Exception):
    """A node sent an event that does not verify; the message names node, seq and why."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


class _NoLookups:
    """check_row asks about other rows only to word a problem; ours are its message."""

    def seq_exists(self, seq: int) -> bool:
        return False

    def later_seq_with_hash(self, digest: bytes, seq: int) -> int | None:
        return None


def row_of(event: WatchEvent) -> Row:
    """The chain row `event` stands for (payload canonical, its hash recomputed).

    Raises:
        ValueError: a hash is not hex, or the payload cannot be encoded canonically.
    """
    try:
        payload = encode_payload(event.payload)
    except ChainError as e:
        raise ValueError(str(e)) from e
    return Row(
        event.seq,
        event.ts_ns,
        event.node.encode(),
        event.source.encode(),
        event.kind.encode(),
        event.subject.encode(),
        payload,
        payload_hash(payload),
        bytes.fromhex(event.prev_hash),
        bytes.fromhex(event.hash),
    )


def follow(
    entry: NodeEntry,
    client: FleetClient,
    store: FleetStore,
    *,
    keep_following: bool,
    on_stored: Callable[[int], None] | None = None,
) -> int:
    """Store `entry`'s events from one past the last stored; return how many were stored.

    With `keep_following` the stream stays open (until the node ends it or goes
    away: the client's errors, ``NodeUnavailable``); otherwise it ends at the head.
    `on_stored` is called with each seq once it is committed.

    Raises:
        Refused: an event does not verify (recorded as a failure first).
        NodeUnavailable, ApiError: the node's (client's) errors.
        StoreError: the store cannot be written.
    """
    before, genesis = store.last(entry.name), store.genesis(entry.name)
    stored = 0
    start = 0 if before is None else before.seq + 1
    for event in client.events(start, follow=keep_following):
        row = _checked(entry, store, event, before, genesis)
        store.append(entry.name, row)
        before, genesis, stored = row, genesis or row, stored + 1
        if on_stored is not None:
            on_stored(row.seq)
    return stored


class Diverged(msgspec.Struct, frozen=True, kw_only=True):
    """A node's chain no longer holds what the fleet stored of it.

    Attributes:
        outcome: ``truncated`` (its head is below the events stored) or
            ``forked`` (its event at the last stored seq hashes otherwise: cut
            short and grown again, or rewritten).
        seq: the last seq the fleet stored.
        head: the node's head seq when ``truncated`` (None: not asked).
    """

    outcome: Literal["truncated", "forked"]
    seq: int
    head: int | None = None


def diverged(client: FleetClient, last: Row | None) -> Diverged | None:
    """How the node's chain departs from the fleet's copy ending at `last`, else None.

    Asks the watch stream for ``last.seq`` (``GET /v1/events``, not followed):
    a whole chain has it, with the hash stored (every stored row was checked
    link by link, so an equal hash there vouches for all before it). When the
    node has no such event its head is ``GET /v1/node``'s ``head_seq``, else (a
    node without that route) the last seq the stream sends from 0 (-1: none).

    Raises:
        NodeUnavailable, ApiError: the node's (client's) errors.
    """
    if last is None:
        return None
    sent = _event_at(client, last.seq)
    if sent is not None:
        return None if sent.hash == last.hash.hex() else Diverged(outcome="forked", seq=last.seq)
    try:
        head = client.node_view().head_seq
    except ApiError:
        head = -1
        for event in client.events(0, follow=False):
            head = event.seq
    return Diverged(outcome="truncated", seq=last.seq, head=head)


def _event_at(client: FleetClient, seq: int) -> WatchEvent | None:
    for event in client.events(seq, follow=False):
        return event if event.seq == seq else None  # one that skips it is follow's to refuse
    return None


def _checked(
    entry: NodeEntry, store: FleetStore, event: WatchEvent, before: Row | None, genesis: Row | None
) -> Row:
    expected = 0 if before is None else before.seq + 1
    try:
        row = row_of(event)
    except ValueError as e:
        _refuse(entry, store, "malformed", f"seq {event.seq}: {e}")
    if row.seq != expected:
        _refuse(entry, store, "gap", f"expected seq {expected}, the node sent seq {row.seq}")
    problem = check_row(row, before, genesis, _NoLookups())
    if problem is not None:
        _refuse(entry, store, problem.reason, f"seq {problem.seq}: {problem.detail}")
    return row


def _refuse(entry: NodeEntry, store: FleetStore, what: str, detail: str) -> NoReturn:
    store.record_failure(entry.name, what, detail)
    raise Refused(f"node {entry.name}: {what}: {detail}; not stored", what)
