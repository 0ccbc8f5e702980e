"""The witness's state: the latest checkpoint it cosigned per origin, in SQLite.

``<data dir>/witness.db`` (WAL, ``synchronous=FULL``: a commit is on disk when
it returns), two tables::

    logs(origin PRIMARY KEY, size, root, note, cosignatures, timestamp_s, updated_s)
    refusals(id, origin, old_size, size, status, reason, note, at_s)

A row of ``logs`` changes only by :meth:`WitnessStore.advance`, a
compare-and-swap on the (size, root) the caller judged against, in one
``BEGIN IMMEDIATE`` transaction: of two submissions judged against the same
state, one wins and the other is told the new size (409), so a cosigned size
never goes back (c2sp.org/tlog-witness, the race after "add-checkpoint").
The witness answers only after that commit returned.

``refusals`` keeps the checkpoints a known log signed but the witness refused
(an inconsistent proof, a fork, an --audit refusal) as evidence: at most
:data:`KEEP_REFUSALS` per origin, the oldest dropped.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import NamedTuple

from infervisor.chain.witness_protocol import AddCheckpoint, Refusal, WitnessState

__all__ = ["DB_FILE", "KEEP_REFUSALS", "Held", "RefusalRecord", "StoreError", "WitnessStore"]

DB_FILE = "witness.db"
"""The state file in the witness's data directory."""

KEEP_REFUSALS = 1000
"""Refused checkpoints kept per origin."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS logs (
    origin TEXT PRIMARY KEY,
    size INTEGER NOT NULL CHECK (size >= 0),
    root BLOB NOT NULL CHECK (length(root) = 32),
    note TEXT NOT NULL,
    cosignatures TEXT NOT NULL,
    timestamp_s INTEGER NOT NULL,
    updated_s INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY,
    origin TEXT NOT NULL,
    old_size INTEGER NOT NULL,
    size INTEGER NOT NULL,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    note TEXT NOT NULL,
    at_s INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS refusals_by_origin ON refusals (origin, id);
"""


class StoreError(Exception):
    """The state file cannot be opened, read or written (the message names it)."""


class Held(NamedTuple):
    """One origin's row: the latest checkpoint cosigned and the cosignature lines given."""

    origin: str
    size: int
    root: bytes
    note: str
    cosignatures: tuple[str, ...]
    timestamp_s: int

    @property
    def state(self) -> WitnessState:
        """(size, root), what `judge` compares with."""
        return WitnessState(self.size, self.root)


class RefusalRecord(NamedTuple):
    """A checkpoint refused: origin, old and new size, status, reason, when."""

    origin: str
    old_size: int
    size: int
    status: int
    reason: str
    at_s: int


class WitnessStore:
    """The witness.db of a data directory; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        """Open (creating) ``path``.

        Raises:
            StoreError: it cannot be opened or is not a witness state file.
        """
        self.path = path
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 10000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as e:
            raise StoreError(f"{path}: cannot open the witness state: {e}") from e

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()

    def get(self, origin: str) -> Held | None:
        """The row of ``origin``, or None if it never cosigned for it."""
        with self._lock:
            row = self._query("SELECT * FROM logs WHERE origin = ?", (origin,)).fetchone()
        return _held(row) if row is not None else None

    def all(self) -> list[Held]:
        """Every origin's row, by origin."""
        with self._lock:
            rows = self._query("SELECT * FROM logs ORDER BY origin", ()).fetchall()
        return [_held(row) for row in rows]

    def advance(self, judged: WitnessState | None, new: Held) -> Held | None:
        """Store ``new`` if the origin still holds ``judged``; durable when it returns.

        Args:
            judged: the state the checkpoint was judged against (None: no row).
            new: the checkpoint cosigned and its cosignature lines.

        Returns:
            None once stored; else the row that another submission stored in
            between (the caller answers 409 with its size).

        Raises:
            StoreError: the write failed (nothing was stored).
        """
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    won = self._swap(judged, new)
                    current = None if won else self._row(new.origin)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: cannot store the checkpoint: {e}") from e
        return current

    def refuse(self, request: AddCheckpoint, refusal: Refusal) -> None:
        """Keep a refused checkpoint of a known log (the oldest beyond KEEP_REFUSALS dropped).

        Raises:
            StoreError: the write failed.
        """
        cp = request.checkpoint
        row = (cp.origin, request.old_size, cp.size, refusal.status, refusal.reason, request.note)
        with self._lock:
            try:
                with self._conn:
                    self._conn.execute("BEGIN IMMEDIATE")
                    self._conn.execute(
                        "INSERT INTO refusals (origin, old_size, size, status, reason, note, at_s)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (*row, int(time.time())),
                    )
                    self._conn.execute(
                        "DELETE FROM refusals WHERE origin = ? AND id NOT IN (SELECT id FROM "
                        "refusals WHERE origin = ? ORDER BY id DESC LIMIT ?)",
                        (cp.origin, cp.origin, KEEP_REFUSALS),
                    )
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: cannot keep the refusal: {e}") from e

    def refusals(self, origin: str | None = None, limit: int = 20) -> list[RefusalRecord]:
        """The latest refusals (of ``origin``, or of all), newest first."""
        sql = (
            "SELECT origin, old_size, size, status, reason, at_s FROM refusals"
            " WHERE ? IS NULL OR origin = ? ORDER BY id DESC LIMIT ?"
        )
        with self._lock:
            rows = self._query(sql, (origin, origin, limit)).fetchall()
        return [RefusalRecord(*row) for row in rows]

    def refusal_counts(self) -> dict[str, tuple[int, str]]:
        """Per origin: refusals kept and the latest one's reason."""
        sql = (
            "SELECT origin, count(*), (SELECT reason FROM refusals AS r WHERE r.origin = "
            "refusals.origin ORDER BY id DESC LIMIT 1) FROM refusals GROUP BY origin"
        )
        with self._lock:
            rows = self._query(sql, ()).fetchall()
        return {origin: (count, reason) for origin, count, reason in rows}

    # ------------------------------------------------------------ plumbing
    def _query(self, sql: str, args: tuple[object, ...]) -> sqlite3.Cursor:
        try:
            return self._conn.execute(sql, args)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot read the witness state: {e}") from e

    def _row(self, origin: str) -> Held | None:
        row = self._conn.execute("SELECT * FROM logs WHERE origin = ?", (origin,)).fetchone()
        return _held(row) if row is not None else None

    def _swap(self, judged: WitnessState | None, new: Held) -> bool:
        values = (
            new.size,
            new.root,
            new.note,
            "".join(f"{line}\n" for line in new.cosignatures),
            new.timestamp_s,
            int(time.time()),
        )
        if judged is None:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO logs (size, root, note, cosignatures, timestamp_s, "
                "updated_s, origin) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*values, new.origin),
            )
        else:
            cur = self._conn.execute(
                "UPDATE logs SET size = ?, root = ?, note = ?, cosignatures = ?, timestamp_s = ?,"
                " updated_s = ? WHERE origin = ? AND size = ? AND root = ?",
                (*values, new.origin, judged.size, judged.root),
            )
        return cur.rowcount == 1


def _held(row: tuple[str, int, bytes, str, str, int, int]) -> Held:
    origin, size, root, note, cosignatures, timestamp_s, _ = row
    return Held(origin, size, root, note, tuple(cosignatures.splitlines()), timestamp_s)
