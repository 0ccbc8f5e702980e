"""`verify_chain`: check a chain file row by row and name the first bad seq.

Streams the rows `ORDER BY seq` through a read-only connection, keeping only
the previous row and the genesis row in memory. The algorithm and its
reasons are specified in docs/chain-format.md ("Verification").

`scan_chain` is the same walk handing every row that checked out to a
consumer (the replay reducer), so a reader verifies what it reads in the one
snapshot it reads it from: one `StoredEvent` at a time, or (`batch`) plain
tuples a list at a time, which is how replay folds. The walk has a fast path
for rows that are what a writer stores (inline hashing, no per-row objects
unless a consumer wants them); anything unusual about a row sends it through
`checks.check_row`, which names the problem exactly as the format document
orders the checks.
"""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Callable, Iterator
from typing import Any

import blake3
import msgspec

from infervisor.chain import schema
from infervisor.chain.checks import Lookups, Problem, Row, check_row, parse_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import ChainFormatError
from infervisor.chain.hashing import EVENT_CONTEXT, PAYLOAD_CONTEXT
from infervisor.chain.records import GENESIS_KIND, StoredEvent

_ROWS = schema.SELECT_EVENTS + " ORDER BY seq"
_PAYLOAD_HASHER = blake3.blake3(derive_key_context=PAYLOAD_CONTEXT)
_EVENT_HASHER = blake3.blake3(derive_key_context=EVENT_CONTEXT)
_SEQ_TS = struct.Struct(">Qq").pack
_LENGTH = struct.Struct(">I").pack
_GENESIS_KIND = GENESIS_KIND.encode()
#: Rows handed to a batch consumer at a time: enough to make the hand-off's cost per
#: row nothing, few enough that a batch is a few hundred kB at most.
BATCH_ROWS = 1024

Consumer = Callable[[StoredEvent], None]
"""Called with each event that checked out, in seq order (see `scan_chain`)."""

Verified = tuple[int, int, str, str, str, bytes, bytes, bytes, bytes]
"""An event that checked out, as a batch consumer gets it (`scan_chain`'s `batch`):
seq, ts_ns, source, kind, subject, payload, payload_hash, prev_hash, hash, the
fields of `StoredEvent` in its order but the node (the chain's: `VerifyReport.node`)."""

Batch = Callable[[list[Verified]], None]
"""Called with the events that checked out, in seq order, a list of them at a time."""


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `verify_chain` found.

    Attributes:
        ok: True if every row checked out and the chain has a genesis.
        events: how many rows checked out (the chain's length when `ok`).
        head_seq: seq of the last row that checked out (None: not even genesis).
        head_hash: hash of that row, 64 hex digits (None: not even genesis).
        node: node named by a well-formed genesis (None: genesis is bad).
        problem: the first problem found (None when `ok`).
    """

    ok: bool
    events: int
    head_seq: int | None
    head_hash: str | None
    node: str | None
    problem: Problem | None


def verify_chain(path: str | os.PathLike[str]) -> VerifyReport:
    """Verify the chain at `path`; never writes, never loads the whole chain.

    Safe on a live chain: it reads one consistent snapshot.

    Returns:
        A report naming the first bad seq and why, or ok with the head.

    Raises:
        ChainFormatError: the file is SQLite but has no `events` table with
            the chain's columns, or its `PRAGMA user_version` is not the
            format version this code reads.
        ChainIOError: the file is missing, unreadable or not SQLite.
    """
    return scan_chain(path)


def scan_chain(
    path: str | os.PathLike[str],
    consume: Consumer | None = None,
    *,
    keep_going: bool = False,
    batch: Batch | None = None,
) -> VerifyReport:
    """Verify the chain at `path` in one snapshot, handing each good event to `consume`
    (or, as tuples, a list at a time, to `batch`).

    Args:
        path: the chain file (opened read-only).
        consume: called with every event that checked out, in seq order,
            before the next row is read; an exception it raises ends the scan
            and propagates (the connection is closed).
        keep_going: after the first problem, still hand the remaining rows
            to the consumer, unchecked (an auditor's `--unverified` read); a
            row that cannot even be read as an event (a NULL or mistyped
            column) ends the scan. The report still names the first problem.
        batch: instead of `consume`, called with lists of `Verified` events (up
            to `BATCH_ROWS`; each list is the consumer's to keep), in seq order:
            what `consume` would get, without a `StoredEvent` and a call per row.
            The rows of a list are read (and checked) before it is handed over;
            the events before a problem, or before an error reading the file,
            are handed over before the scan ends, so an exception the consumer
            raises for one of them comes first, as with `consume`.

    Returns:
        The verdict on the whole chain, as `verify_chain` gives it.

    Raises:
        ValueError: both `consume` and `batch`.
        ChainFormatError, ChainIOError: as `verify_chain`.
    """
    if consume is not None and batch is not None:
        raise ValueError("scan_chain takes consume or batch, not both")
    name = os.fspath(path)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "verify"):
            _check_columns(conn, name)
            conn.execute("BEGIN")
            schema.check_version(conn, name)
            rows = conn.execute(_ROWS)
            report = _walk(rows, SqlLookups(conn), consume, batch)
            if keep_going and report.problem is not None:
                _feed_rest(conn, report, consume, batch)
            return report
    finally:
        conn.close()


def _walk(
    rows: Iterator[Any], lookups: Lookups, consume: Consumer | None, batch: Batch | None
) -> VerifyReport:
    """The verification loop: genesis the careful way, then the fast path per row."""
    first = next(rows, None)
    if first is None:
        empty = Problem(seq=0, reason="bad genesis", detail="the chain is empty: no row at seq 0")
        return _report(0, None, None, empty)
    genesis = parse_row(first, 0)
    if isinstance(genesis, Problem):
        return _report(0, None, None, genesis)
    problem = check_row(genesis, None, None, lookups)
    if problem is not None:
        return _report(0, None, None, problem)
    node = genesis.node.decode()
    if consume is not None:
        consume(stored_event(genesis, node))
        batch, limit = _one_by_one(consume, node), 1
    else:
        limit = BATCH_ROWS
    return _walk_rest(rows, first, genesis, lookups, _Hand(batch, limit, verified(genesis)))


class _Hand:
    """Where `_walk_rest` hands the rows that checked out: a batch consumer, the number
    of rows it takes at a time, the rows already checked (genesis) to go first."""

    __slots__ = ("deliver", "limit", "start")

    def __init__(self, deliver: Batch | None, limit: int, start: Verified) -> None:
        self.deliver, self.limit = deliver, limit
        self.start = [start] if deliver is not None and limit > 1 else []


def _one_by_one(consume: Consumer, node: str) -> Batch:
    """A batch consumer (of one row at a time) that hands `consume` each row's `StoredEvent`."""

    def deliver(rows: list[Verified]) -> None:
        for row in rows:
            consume(stored_of(row, node))

    return deliver


def _walk_rest(
    rows: Iterator[Any], first: Any, genesis: Row, lookups: Lookups, hand: _Hand
) -> VerifyReport:
    """Every row after genesis: inline checks, `_slow` for the first row that fails one.

    ``struct.pack`` refuses a seq or ts_ns that is not an integer in range, a hasher
    a payload that is not bytes, and the comparisons need the hashes to be the 32
    bytes expected: each sends the row to `_slow`, which names what is wrong. A
    (source, kind, subject) triple is decoded once (`_names`, with its header's
    packer); one hasher per context is fed, read and reset per row (cheaper than a copy).
    """
    node = genesis.node
    names: dict[tuple[object, object, object], _Names] = {}
    p_update, p_digest, p_reset = _methods(_PAYLOAD_HASHER.copy())
    e_update, e_digest, e_reset = _methods(_EVENT_HASHER.copy())
    deliver, limit, chunk = hand.deliver or _nothing, hand.limit, hand.start
    put = None if hand.deliver is None else chunk.append
    expected, want_prev, last = 1, genesis.hash, first
    try:
        for raw in rows:
            seq, ts_ns, row_node, source, kind, subject, payload, digest, prev, event = raw
            key = (source, kind, subject)
            texts = names.get(key) or _names(names, key, node)
            sealed = False
            if texts is not None:
                try:
                    p_update(payload)
                    if p_digest() == digest:
                        e_update(texts[3](seq, ts_ns, texts[4], digest, prev))
                        sealed = e_digest() == event
                        e_reset()
                except (TypeError, struct.error):
                    sealed = False
                p_reset()
            if (
                texts is None
                or not sealed
                or seq != expected
                or prev != want_prev
                or row_node != node
            ):
                if chunk:  # the rows before it go first, as with `consume`
                    deliver(chunk)
                return _slow(raw, last, genesis, lookups, expected)
            if put is not None:
                put((seq, ts_ns, texts[0], texts[1], texts[2], payload, digest, prev, event))
                if len(chunk) >= limit:
                    full, chunk = chunk, []
                    put = chunk.append
                    deliver(full)
            expected, want_prev, last = seq + 1, event, raw
    except sqlite3.Error:
        if chunk:  # the rows read before the file failed go first, as with `consume`
            deliver(chunk)
        raise
    if chunk:
        deliver(chunk)
    head = parse_row(last, expected - 1)
    assert not isinstance(head, Problem)
    return _report(expected, head, genesis, None)


def _methods(hasher: Any) -> tuple[Callable[[Any], Any], Callable[[], bytes], Callable[[], Any]]:
    """A hasher's update, digest and reset, bound (the walk calls them per row)."""
    return hasher.update, hasher.digest, hasher.reset


_Names = tuple[str, str, str, Callable[..., bytes], bytes]
"""A row's source, kind and subject as text, the packer of its header and the part of
the header between ts_ns and payload_hash (the node, source, kind and subject, each
with its length)."""


def _names(
    cache: dict[tuple[object, object, object], _Names],
    key: tuple[object, object, object],
    node: bytes,
) -> _Names | None:
    """Decode and remember a (source, kind, subject) triple; None if one is unusual.

    The packer writes seq and ts_ns (``>Qq``), the triple's part and two 32-byte
    fields; it pads or cuts a field of another length, so a row is sealed only if
    its payload hash is the 32-byte digest and its previous hash the one expected.
    """
    texts: list[str] = []
    middle = _LENGTH(len(node)) + node
    for i, value in enumerate(key):
        if not isinstance(value, bytes) or (i == 1 and value == _GENESIS_KIND):
            return None
        try:
            texts.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            return None
        middle += _LENGTH(len(value)) + value
    pack = struct.Struct(f">Qq{len(middle)}s32s32s").pack
    cache[key] = entry = (texts[0], texts[1], texts[2], pack, middle)
    return entry


def _nothing(rows: list[Verified]) -> None:
    """The batch consumer of a scan without one (it is never handed a row)."""


def _slow(
    raw: tuple[object, ...],
    last: tuple[object, ...],
    genesis: Row,
    lookups: Lookups,
    expected: int,
) -> VerifyReport:
    """Check one unusual row the documented way and report (it is almost always bad)."""
    before = parse_row(last, expected - 1)
    assert not isinstance(before, Problem)
    row = parse_row(raw, expected)
    problem = row if isinstance(row, Problem) else check_row(row, before, genesis, lookups)
    if problem is None:  # cannot happen: the fast path only defers rows check_row refuses
        problem = Problem(seq=expected, reason="malformed row", detail=f"row {raw!r} is unusual")
    return _report(expected, before, genesis, problem)


def verified(row: Row) -> Verified:
    """The `Verified` tuple of a checked row."""
    return (
        row.seq,
        row.ts_ns,
        row.source.decode(),
        row.kind.decode(),
        row.subject.decode(),
        row.payload,
        row.payload_hash,
        row.prev_hash,
        row.hash,
    )


def stored_of(row: Verified, node: str) -> StoredEvent:
    """The `StoredEvent` of a `Verified` row of the chain of `node`."""
    seq, ts_ns, *rest = row
    return schema.to_event((seq, ts_ns, node, *rest))


def stored_event(row: Row, node: str | None = None) -> StoredEvent:
    """The `StoredEvent` of a checked row (`node`: the chain's node id, else the row's)."""
    return StoredEvent(
        seq=row.seq,
        ts_ns=row.ts_ns,
        node=row.node.decode() if node is None else node,
        source=row.source.decode(),
        kind=row.kind.decode(),
        subject=row.subject.decode(),
        payload=row.payload,
        payload_hash=row.payload_hash,
        prev_hash=row.prev_hash,
        hash=row.hash,
    )


def _feed_rest(
    conn: sqlite3.Connection, report: VerifyReport, consume: Consumer | None, batch: Batch | None
) -> None:
    """Hand the rows from the first bad one on to the consumer, unchecked (`keep_going`),
    each before the next is read (a `StoredEvent` holds the row's own node)."""
    after = -1 if report.head_seq is None else report.head_seq
    for raw in conn.execute(schema.SELECT_EVENTS + " WHERE seq > ? ORDER BY seq", (after,)):
        row = parse_row(raw, after + 1)
        if isinstance(row, Problem):
            return
        if batch is not None:
            batch([verified(row)])
        elif consume is not None:
            consume(stored_event(row, row.node.decode("utf-8", "replace")))
        after = row.seq


def _report(
    count: int, head: Row | None, genesis: Row | None, problem: Problem | None
) -> VerifyReport:
    return VerifyReport(
        ok=problem is None,
        events=count,
        head_seq=None if head is None else head.seq,
        head_hash=None if head is None else head.hash.hex(),
        node=None if genesis is None else genesis.node.decode(),
        problem=problem,
    )


def _check_columns(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a file whose events table is not a chain's, naming what the file is:
    empty, a database without tables, without an events table (a newcomer's
    trial, stop 34, read "lacks columns [...]" of a 0-byte file), or an events
    table without the chain's columns.

    Raises:
        ChainFormatError: naming the file and what it is.
    """
    found = {row[1].decode() for row in conn.execute("PRAGMA table_info(events)")}
    missing = [name for name in schema.COLUMNS if name not in found]
    if not missing:
        return
    if found:
        what = f"table events lacks columns {missing}"
    elif not schema.is_empty(conn):
        what = "it has no events table"
    elif _size(path) == 0:
        what = "it is an empty file (0 bytes)"
    else:
        what = "it is an SQLite database with no tables"
    raise ChainFormatError(f"{path} is not an infervisor chain: {what}")


def _size(path: str) -> int | None:
    """The file's size in bytes (None: it cannot be read, or is no file)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return None


class SqlLookups:
    """`Lookups` answered by queries on the connection being verified."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def seq_exists(self, seq: int) -> bool:
        return (
            self._conn.execute("SELECT 1 FROM events WHERE seq = ?", (seq,)).fetchone() is not None
        )

    def later_seq_with_hash(self, digest: bytes, seq: int) -> int | None:
        row = self._conn.execute(
            "SELECT seq FROM events WHERE hash = ? AND typeof(seq) = 'integer' AND seq > ? "
            "ORDER BY seq LIMIT 1",
            (digest, seq),
        ).fetchone()
        return None if row is None else int(row[0])
