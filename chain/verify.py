"""`verify_chain`: check a chain file row by row and name the first bad seq.

Streams the rows `ORDER BY seq` through a read-only connection, keeping only
the previous row and the genesis row in memory. The algorithm and its
reasons are specified in docs/chain-format.md ("Verification").
"""

from __future__ import annotations

import os
import sqlite3

import msgspec

from infervisor.chain import schema
from infervisor.chain.checks import Lookups, Problem, Row, check_row, parse_row
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import ChainFormatError

_ROWS = schema.SELECT_EVENTS + " ORDER BY seq"


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
            the chain's columns.
        ChainIOError: the file is missing, unreadable or not SQLite.
    """
    name = os.fspath(path)
    conn = connect_reader(name, text_as_bytes=True)
    try:
        with translated(name, "verify"):
            _check_columns(conn, name)
            conn.execute("BEGIN")
            return _walk(conn.execute(_ROWS), _SqlLookups(conn))
    finally:
        conn.close()


def _walk(rows: sqlite3.Cursor, lookups: Lookups) -> VerifyReport:
    before: Row | None = None
    genesis: Row | None = None
    count = 0
    for raw in rows:
        row = parse_row(raw, 0 if before is None else before.seq + 1)
        if isinstance(row, Problem):
            return _report(count, before, genesis, row)
        problem = check_row(row, before, genesis, lookups)
        if problem is not None:
            return _report(count, before, genesis, problem)
        before, genesis, count = row, genesis or row, count + 1
    if before is None:
        empty = Problem(seq=0, reason="bad genesis", detail="the chain is empty: no row at seq 0")
        return _report(0, None, None, empty)
    return _report(count, before, genesis, None)


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
    found = {row[1].decode() for row in conn.execute("PRAGMA table_info(events)")}
    missing = [name for name in schema.COLUMNS if name not in found]
    if missing:
        raise ChainFormatError(
            f"{path} is not an infervisor chain: table events lacks columns {missing}"
        )


class _SqlLookups:
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
