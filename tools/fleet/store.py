"""The fleet's own SQLite store: every node's events, the checkpoints it verified,
and the verification failures it saw.

Tables (one file, WAL, ``synchronous=FULL``: a committed row survives power loss)::

    events     (node, seq, ts_ns, node_id, source, kind, subject, payload,
                payload_hash, prev_hash, hash)      PRIMARY KEY (node, seq)
    verified   (node PRIMARY KEY, size, root, note, ts_ns)
    failures   (node, what, detail, ts_ns)          UNIQUE (node, what, detail)

``node`` is the fleet's name of the node (its ``[[nodes]] name``); the other
event columns are the chain's own (docs/chain-format.md), so a stored row is
checked by ``chain.checks.check_row`` as the node's chain is. An event is
committed before the follower asks for the next one, and the primary key
refuses a second row of a seq: a follower killed at any point resumes from
the last committed seq with no gap and no repeat.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, NamedTuple

from infervisor.chain.checks import Row
from infervisor.chain.connect import connect_writer
from infervisor.chain.errors import ChainError

__all__ = ["Failure", "FleetStore", "StoreError", "Verified"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    node TEXT NOT NULL, seq INTEGER NOT NULL, ts_ns INTEGER NOT NULL,
    node_id TEXT NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, payload BLOB NOT NULL, payload_hash BLOB NOT NULL,
    prev_hash BLOB NOT NULL, hash BLOB NOT NULL,
    PRIMARY KEY (node, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS verified (
    node TEXT PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL,
    note TEXT NOT NULL, ts_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    node TEXT NOT NULL, what TEXT NOT NULL, detail TEXT NOT NULL, ts_ns INTEGER NOT NULL,
    UNIQUE (node, what, detail)
);
"""

_SELECT = (
    "SELECT seq, ts_ns, node_id, source, kind, subject, payload, payload_hash, prev_hash, hash "
    "FROM events WHERE node = ?"
)
_INSERT = (
    "INSERT OR IGNORE INTO events (node, seq, ts_ns, node_id, source, kind, subject, payload, "
    "payload_hash, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class StoreError(Exception):
    """The store cannot be opened, read or written (the message names the file)."""


class Verified(NamedTuple):
    """The last checkpoint of a node the fleet verified: its size, root and note."""

    size: int
    root: bytes
    note: str


class Failure(NamedTuple):
    """A verification failure recorded for a node (``what``: a short kind)."""

    node: str
    what: str
    detail: str
    ts_ns: int


class FleetStore:
    """One connection to the store (thread-safe use: one per thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = connect_writer(str(path))
            self.conn.executescript(_SCHEMA)
        except (OSError, ChainError, sqlite3.Error) as e:
            raise StoreError(f"{path}: cannot open the fleet store: {e}") from e

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> FleetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def last(self, node: str) -> Row | None:
        """The stored event of `node` with the highest seq (None: none yet)."""
        return self._row(_SELECT + " ORDER BY seq DESC", node)

    def genesis(self, node: str) -> Row | None:
        """The stored seq-0 event of `node`."""
        return self._row(_SELECT + " AND seq = 0", node)

    def _row(self, query: str, node: str) -> Row | None:
        found = self._read(query + " LIMIT 1", (node,))
        if not found:
            return None
        seq, ts_ns, node_id, source, kind, subject, payload, digest, prev, own = found[0]
        return Row(
            int(seq),
            int(ts_ns),
            str(node_id).encode(),
            str(source).encode(),
            str(kind).encode(),
            str(subject).encode(),
            bytes(payload),
            bytes(digest),
            bytes(prev),
            bytes(own),
        )

    def append(self, node: str, row: Row) -> None:
        """Store `row` of `node` and commit (durable on return).

        A row of that seq with the same hash already there (stored by another
        follower of the same store: `fleet check` beside `fleet serve`) is left as it is.

        Raises:
            StoreError: not stored (another row of that seq is there, or SQLite failed).
        """
        texts = tuple(t.decode() for t in (row.node, row.source, row.kind, row.subject))
        values = (node, row.seq, row.ts_ns, *texts, *row[6:])
        try:
            if self.conn.execute(_INSERT, values).rowcount == 1:
                return
            (held,) = self.conn.execute(
                "SELECT hash FROM events WHERE node = ? AND seq = ?", (node, row.seq)
            ).fetchone()
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: node {node} seq {row.seq}: not stored: {e}") from e
        if bytes(held) != row.hash:
            raise StoreError(
                f"{self.path}: node {node} seq {row.seq}: another event of that seq is stored"
            )

    def count(self, node: str) -> int:
        """Events stored of `node`."""
        return int(self._read("SELECT count(*) FROM events WHERE node = ?", (node,))[0][0])

    def hashes(self, node: str, below: int) -> list[bytes]:
        """The event hashes of `node`, seq 0 .. below-1, in order."""
        rows = self._read(
            "SELECT hash FROM events WHERE node = ? AND seq < ? ORDER BY seq", (node, below)
        )
        return [bytes(h) for (h,) in rows]

    def hash_at(self, node: str, seq: int) -> bytes | None:
        """The hash of `node`'s stored event `seq` (None: not stored)."""
        rows = self._read("SELECT hash FROM events WHERE node = ? AND seq = ?", (node, seq))
        return bytes(rows[0][0]) if rows else None

    def rotations(self, node: str) -> list[tuple[str, bytes]]:
        """(kind, payload) of the key rotations stored of `node` (chain/keys.py)."""
        rows = self._read(
            "SELECT kind, payload FROM events WHERE node = ? AND kind = 'chain.key_rotated' "
            "ORDER BY seq",
            (node,),
        )
        return [(str(k), bytes(p)) for k, p in rows]

    def verified(self, node: str) -> Verified | None:
        """The last checkpoint of `node` the fleet verified."""
        rows = self._read("SELECT size, root, note FROM verified WHERE node = ?", (node,))
        return Verified(int(rows[0][0]), bytes(rows[0][1]), str(rows[0][2])) if rows else None

    def set_verified(self, node: str, checkpoint: Verified) -> None:
        """Record `checkpoint` as the last verified of `node` (committed on return)."""
        self._write(
            "INSERT OR REPLACE INTO verified VALUES (?, ?, ?, ?, ?)",
            (node, checkpoint.size, checkpoint.root, checkpoint.note, time.time_ns()),
        )

    def record_failure(self, node: str, what: str, detail: str) -> bool:
        """Record a verification failure of `node`; False when the same one was recorded."""
        cur = self._write(
            "INSERT OR IGNORE INTO failures VALUES (?, ?, ?, ?)",
            (node, what, detail, time.time_ns()),
        )
        return cur.rowcount == 1

    def failures(self, node: str | None = None) -> list[Failure]:
        """The failures recorded (of `node`, or all), oldest first."""
        query = "SELECT node, what, detail, ts_ns FROM failures"
        rows = (
            self._read(query + " WHERE node = ? ORDER BY ts_ns", (node,))
            if node
            else (self._read(query + " ORDER BY ts_ns", ()))
        )
        return [Failure(str(n), str(w), str(d), int(t)) for n, w, d, t in rows]

    def _read(self, query: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        try:
            return list(self.conn.execute(query, args).fetchall())
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot read the fleet store: {e}") from e

    def _write(self, query: str, args: tuple[object, ...]) -> sqlite3.Cursor:
        try:
            return self.conn.execute(query, args)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot write the fleet store: {e}") from e
