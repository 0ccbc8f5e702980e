"""Snapshots of the projection: a `NodeState` with the chain position it covers.

A snapshot lets a boot replay only the events after it (issue 22). It is a
cache, never evidence: no auditor reads it, ``chain verify`` and ``replay``
ignore it, and a node that finds it missing, unreadable, written by other
code or disagreeing with the chain replays the whole chain instead
(docs/chain-format.md, "Snapshots").

Layout (msgpack, one :class:`Snapshot` record)::

    format       "infervisor.snapshot/1"
    fingerprint  the projection's code: see `fingerprint`
    node_id      the chain's node
    seq, hash    the last event folded in (its seq, its event hash, hex)
    state_hash   BLAKE3 of `state`, hex (a torn or corrupted body is refused)
    state        the NodeState, msgpack

It is bound to the chain by (seq, hash): :func:`resume_chain` refuses it
unless the chain's event at `seq` has that hash, then verifies every event
after it (docs/chain-format.md section 5, as the boot replay always did) and
folds it onto the state. Pure but for reading the chain; writing the file is
the node's (actors/snapshots.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import blake3
import msgspec

from infervisor.chain.checks import Problem, Row, check_row, parse_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import ChainTampered
from infervisor.chain.schema import SELECT_EVENTS
from infervisor.chain.verify import SqlLookups, stored_event

from .reducer import Folder
from .state import NodeState

__all__ = [
    "FORMAT",
    "SNAPSHOT_FILE",
    "Resumed",
    "Snapshot",
    "SnapshotRejected",
    "decode_snapshot",
    "encode_snapshot",
    "fingerprint",
    "fingerprint_of",
    "resume_chain",
]

#: The snapshot's file name in the node's data dir (beside chain.db).
SNAPSHOT_FILE = "state.snapshot"
#: The envelope's format tag; bump it when the envelope itself changes.
FORMAT = "infervisor.snapshot/1"
#: The modules whose code decides what a chain folds into: a change to any of them
#: (a field, an event kind, a reducer rule) makes older snapshots unusable.
_FOLD_MODULES = (
    "callers", "durations", "event_base", "events", "fleet_events", "folder", "instance_rules",
    "lifecycle", "node_events", "node_sets", "reasons", "reducer", "residency_events",
    "state", "upcast",
)  # fmt: skip


class SnapshotRejected(Exception):
    """A snapshot that cannot be used (``reason``: why, for the node log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The stored record (see the module docstring)."""

    format: str
    fingerprint: str
    node_id: str
    seq: int
    hash: str
    state_hash: str
    state: bytes


class Resumed(NamedTuple):
    """The state at the chain's head and how many events were folded onto the snapshot."""

    state: NodeState
    replayed: int


_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE_STATE = msgspec.msgpack.Decoder(NodeState).decode
_DECODE_ENVELOPE = msgspec.msgpack.Decoder(Snapshot).decode


@functools.cache
def fingerprint() -> str:
    """The fingerprint of this code's projection: :func:`fingerprint_of` `NodeState`
    and the source of the replay modules that fold events into it. Any change to
    either (a field or an event kind added, a reducer rule changed) gives another
    fingerprint, so a snapshot written by other code is never loaded as this
    code's. Without the sources (a build without .py files), the installed
    distribution's version stands in for them."""
    sources = []
    for name in _FOLD_MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        path = getattr(module, "__file__", None)
        try:
            sources.append(Path(path).read_bytes() if path else name.encode())
        except OSError:
            sources.append(_version().encode())
    return fingerprint_of(NodeState, sources)


def fingerprint_of(state_type: type[Any], sources: Iterable[bytes]) -> str:
    """BLAKE3 (hex) of the JSON schema of `state_type` (every field, type, default
    and enum value, nested records included) and of each of `sources` in turn."""
    digest = blake3.blake3(msgspec.json.encode(msgspec.json.schema(state_type)))
    for source in sources:
        digest.update(len(source).to_bytes(8, "big"))
        digest.update(source)
    return digest.hexdigest()


def _version() -> str:
    try:
        return importlib.metadata.version("infervisor")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def encode_snapshot(state: NodeState) -> bytes:
    """The snapshot of `state` (covering the event at ``state.head_seq``).

    Raises:
        ValueError: the state is not at an event (head_seq < 0), or holds a value
            msgpack cannot carry (an integer beyond 64 bits in a spec).
    """
    if state.head_seq < 0 or not state.head_hash:
        raise ValueError(f"a snapshot covers an event: head_seq {state.head_seq}")
    try:
        body = _ENCODE(state)
    except (msgspec.EncodeError, OverflowError) as e:
        raise ValueError(f"the state cannot be encoded: {e}") from e
    record = Snapshot(
        format=FORMAT,
        fingerprint=fingerprint(),
        node_id=state.node_id,
        seq=state.head_seq,
        hash=state.head_hash,
        state_hash=blake3.blake3(body).hexdigest(),
        state=body,
    )
    return _ENCODE(record)


def decode_snapshot(data: bytes, node_id: str) -> NodeState:
    """The state a snapshot holds, once its envelope checks out.

    Raises:
        SnapshotRejected: not a snapshot, another format, another code's
            projection (fingerprint), another node's, a body that does not
            hash to its digest, or a state whose head is not the envelope's.
    """
    try:
        record = _DECODE_ENVELOPE(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SnapshotRejected(f"not a snapshot ({e})") from e
    if record.format != FORMAT:
        raise SnapshotRejected(f"format {record.format!r}, this code reads {FORMAT!r}")
    if record.fingerprint != fingerprint():
        raise SnapshotRejected("written by other code (its projection's fingerprint differs)")
    if record.node_id != node_id:
        raise SnapshotRejected(f"node {record.node_id!r}, the chain is {node_id!r}'s")
    if blake3.blake3(record.state).hexdigest() != record.state_hash:
        raise SnapshotRejected("its state does not hash to its state_hash (torn or altered)")
    try:
        state = _DECODE_STATE(record.state)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SnapshotRejected(f"its state cannot be decoded ({e})") from e
    if (state.head_seq, state.head_hash, state.node_id) != (record.seq, record.hash, node_id):
        raise SnapshotRejected("its state's head is not the one it says it covers")
    return state


def resume_chain(path: str | os.PathLike[str], state: NodeState) -> Resumed:
    """Fold the events of the chain at `path` after ``state.head_seq`` onto `state`,
    each verified first (docs/chain-format.md section 5), in one read snapshot.

    Raises:
        SnapshotRejected: the chain has no event at ``state.head_seq``, or that
            event's hash is not ``state.head_hash`` (the snapshot is stale or
            belongs to another history).
        ChainTampered: an event after it fails verification (names seq and reason).
        ReplayError, EventDecodeError: an event after it does not fold.
        ChainIOError: the chain cannot be read.
    """
    name = os.fspath(path)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "read"):
            conn.execute("BEGIN")
            before = _row(conn, name, state.head_seq)
            if before is None or before.hash.hex() != state.head_hash:
                found = "no event" if before is None else f"hash {before.hash.hex()[:16]}..."
                raise SnapshotRejected(
                    f"it covers seq {state.head_seq} with hash {state.head_hash[:16]}..., "
                    f"the chain has {found} there"
                )
            genesis = _row(conn, name, 0)
            return _fold_after(conn, name, state, before, genesis)
    finally:
        conn.close()


def _row(conn: sqlite3.Connection, path: str, seq: int) -> Row | None:
    raw = conn.execute(SELECT_EVENTS + " WHERE seq = ?", (seq,)).fetchone()
    if raw is None:
        return None
    row = parse_row(raw, seq)
    if isinstance(row, Problem):
        raise ChainTampered(path, row.seq, row.reason, row.detail)
    return row


def _fold_after(
    conn: sqlite3.Connection, path: str, state: NodeState, before: Row, genesis: Row | None
) -> Resumed:
    """Verify and fold every event after `before` (the snapshot's) onto `state`."""
    folder = Folder.resume(state)
    feed = folder.feed
    lookups = SqlLookups(conn)
    node = state.node_id
    count = 0
    rows = conn.execute(SELECT_EVENTS + " WHERE seq > ? ORDER BY seq", (before.seq,))
    for raw in rows:
        row = parse_row(raw, before.seq + 1)
        if isinstance(row, Problem):
            raise ChainTampered(path, row.seq, row.reason, row.detail)
        problem = check_row(row, before, genesis, lookups)
        if problem is not None:
            raise ChainTampered(path, problem.seq, problem.reason, problem.detail)
        feed(stored_event(row, node))
        before, count = row, count + 1
    return Resumed(folder.state(node), count)
