"""Checkpoints stored in the chain's database, and the writer that makes them.

The `checkpoints` table lives beside `events` in the chain file
(docs/chain-format.md, "Checkpoints"). Like `events` it is append-only:
triggers refuse an update, a delete, a checkpoint that does not grow the
tree or one that covers events not stored::

    CREATE TABLE checkpoints (
        tree_size INTEGER PRIMARY KEY CHECK (typeof(tree_size) = 'integer' AND tree_size >= 1),
        ts_ns     INTEGER NOT NULL CHECK (typeof(ts_ns) = 'integer'),
        note      TEXT NOT NULL CHECK (typeof(note) = 'text')
    );

`Checkpointer` keeps the Merkle tree of the chain as a compact range (one
SHA-256 per event, plus on average one per event for the nodes) and signs a
checkpoint every `every_events` events, or at the first append `every_s`
seconds after the last one, and on `close`. "The last one" is the latest
stored checkpoint (its `ts_ns`), whichever run signed it, else the genesis:
a node restarted more often than every `every_s` seconds still signs (a
newcomer's trial, stop 33: the timer started over with every run, so a
node killed and restarted every few minutes never signed its events and no
witness saw them), and a boot whose last checkpoint is already older signs
at its first commit. A checkpoint's own commit is not
fsynced (synchronous=NORMAL on its connection): it becomes durable with the
next event commit, and the one written by `close` is fsynced.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from infervisor.chain.checkpoint import (
    Checkpoint,
    read_checkpoint,
    read_checkpoint_by,
    sign_checkpoint,
)
from infervisor.chain.connect import connect_writer, immediate, read_only, translated
from infervisor.chain.errors import CheckpointError
from infervisor.chain.merkle import CompactTree
from infervisor.chain.note import Signer, Verifier
from infervisor.chain.records import StoredEvent

TABLE = """
CREATE TABLE IF NOT EXISTS checkpoints (
    tree_size INTEGER PRIMARY KEY CHECK (typeof(tree_size) = 'integer' AND tree_size >= 1),
    ts_ns     INTEGER NOT NULL CHECK (typeof(ts_ns) = 'integer'),
    note      TEXT NOT NULL CHECK (typeof(note) = 'text')
)
"""

TRIGGERS = {
    "checkpoints_append_only_insert": """
CREATE TRIGGER IF NOT EXISTS checkpoints_append_only_insert BEFORE INSERT ON checkpoints
BEGIN
    SELECT RAISE(ABORT, 'chain: a checkpoint must cover more events than the latest')
    WHERE NEW.tree_size <= (SELECT coalesce(max(tree_size), 0) FROM checkpoints);
    SELECT RAISE(ABORT, 'chain: a checkpoint cannot cover events that are not stored')
    WHERE NEW.tree_size > (SELECT coalesce(max(seq), -1) + 1 FROM events);
END
""",
    "checkpoints_append_only_update": """
CREATE TRIGGER IF NOT EXISTS checkpoints_append_only_update BEFORE UPDATE ON checkpoints
BEGIN
    SELECT RAISE(ABORT, 'chain: checkpoints are append-only; UPDATE refused');
END
""",
    "checkpoints_append_only_delete": """
CREATE TRIGGER IF NOT EXISTS checkpoints_append_only_delete BEFORE DELETE ON checkpoints
BEGIN
    SELECT RAISE(ABORT, 'chain: checkpoints are append-only; DELETE refused');
END
""",
}


def _normal(sql: str) -> str:
    """SQL as sqlite_master stores it (no IF NOT EXISTS), whitespace runs made one space."""
    return " ".join(sql.replace(" IF NOT EXISTS", "", 1).split()).rstrip(";").rstrip()


def trigger_problems(conn: sqlite3.Connection) -> list[str]:
    """Return what is wrong with the checkpoints table's triggers, by their SQL ([]: as created)."""
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'checkpoints'"
    ).fetchall()
    found = {_text(name): _normal(_text(sql or "")) for name, sql in rows}
    missing = sorted(set(TRIGGERS) - set(found))
    altered = sorted(n for n, sql in TRIGGERS.items() if n in found and found[n] != _normal(sql))
    added = sorted(set(found) - set(TRIGGERS))
    return [
        f"{what} {names}"
        for what, names in (("missing", missing), ("altered", altered), ("not ours", added))
        if names
    ]


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


DEFAULT_EVERY_EVENTS = 1000
DEFAULT_EVERY_S = 300.0


class StoredCheckpoint(NamedTuple):
    """A row of the checkpoints table (signature not checked).

    Attributes:
        tree_size: events covered.
        ts_ns: when it was signed, ns since the Unix epoch, UTC.
        note: the signed note.
    """

    tree_size: int
    ts_ns: int
    note: str


FRONTIERS = """
CREATE TABLE IF NOT EXISTS checkpoint_frontiers (
    tree_size INTEGER PRIMARY KEY,
    frontier  BLOB NOT NULL
)
"""
"""The Merkle tree's compact range at each checkpoint (merkle.CompactTree.frontier).

Not signed and not needed to verify anything: it spares the boot check and
the checkpoint writer a read of every event below the checkpoint. Whoever
edits it gains nothing: a frontier whose root is not the signed root is
ignored and the events are read instead."""


def create_table(conn: sqlite3.Connection) -> None:
    """Create the checkpoints table, its triggers and the frontiers table if missing
    (inside a write transaction)."""
    conn.execute(TABLE)
    for trigger in TRIGGERS.values():
        conn.execute(trigger)
    conn.execute(FRONTIERS)


def frontier_of(conn: sqlite3.Connection, tree_size: int) -> CompactTree | None:
    """The stored compact range of the tree of `tree_size` events, or None (none
    stored, or not a well-formed one)."""
    try:
        row = conn.execute(
            "SELECT frontier FROM checkpoint_frontiers WHERE tree_size = ?", (tree_size,)
        ).fetchone()
    except sqlite3.OperationalError:
        return None  # a chain from before frontiers were kept
    if row is None or not isinstance(row[0], bytes):
        return None
    try:
        return CompactTree.from_frontier(tree_size, row[0])
    except ValueError:
        return None


def has_table(conn: sqlite3.Connection) -> bool:
    """Return True if the database has a checkpoints table."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'"
    ).fetchone()
    return row is not None


def stored_checkpoints(conn: sqlite3.Connection) -> list[StoredCheckpoint]:
    """Return every stored checkpoint, smallest tree first ([] without the table)."""
    if not has_table(conn):
        return []
    rows = conn.execute("SELECT tree_size, ts_ns, note FROM checkpoints ORDER BY tree_size")
    return [StoredCheckpoint(int(size), int(ts), _text(note)) for size, ts, note in rows]


def latest_checkpoint(conn: sqlite3.Connection) -> StoredCheckpoint | None:
    """Return the stored checkpoint with the largest tree, or None."""
    if not has_table(conn):
        return None
    row = conn.execute(
        "SELECT tree_size, ts_ns, note FROM checkpoints ORDER BY tree_size DESC LIMIT 1"
    ).fetchone()
    return None if row is None else StoredCheckpoint(int(row[0]), int(row[1]), _text(row[2]))


def read_stored(path: str | os.PathLike[str]) -> list[StoredCheckpoint]:
    """Return the checkpoints stored in the chain file at `path` (read-only).

    Raises:
        ChainIOError: the file cannot be read.
    """
    return read_only(path, "read checkpoints of", stored_checkpoints)


def verified(stored: Iterable[StoredCheckpoint], *verifiers: Verifier) -> list[Checkpoint]:
    """Return the stored checkpoints whose signature verifies with one of `verifiers`
    (others skipped), in the order stored."""
    good = []
    for row in stored:
        try:
            cp = read_checkpoint_by(row.note, verifiers)
        except CheckpointError:
            continue
        if cp.tree_size == row.tree_size:
            good.append(cp)
    return good


def event_hashes(conn: sqlite3.Connection, below: int | None = None) -> list[bytes]:
    """Return the stored `hash` of the events in seq order (all, or seq < `below`)."""
    if below is None:
        rows = conn.execute("SELECT hash FROM events ORDER BY seq")
    else:
        rows = conn.execute("SELECT hash FROM events WHERE seq < ? ORDER BY seq", (below,))
    return [h if isinstance(h, bytes) else b"" for (h,) in rows]  # a malformed hash never matches


class Checkpointer:
    """Signs and stores checkpoints of one chain while it grows.

    Not thread-safe: call it from the chain's single writer (the chain writer
    actor calls `observe` after each commit and `close` on stop).

    Attributes:
        last_size: tree size of the latest stored checkpoint (0: none).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        node_id: str,
        signer: Signer,
        *,
        every_events: int = DEFAULT_EVERY_EVENTS,
        every_s: float = DEFAULT_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """Open a connection of its own on the chain at `path`, create the table if
        missing and rebuild the Merkle tree of the events already stored (reads
        every stored event hash once).

        Args:
            every_events: sign once this many events were added since the last (>= 1).
            every_s: or at the first append this many seconds after the last (> 0),
                counted from the latest stored checkpoint's ``ts_ns`` (else the
                genesis's) on `now_ns`, then on `monotonic`.
            monotonic: the clock the timer runs on within this run, seconds.
            now_ns: wall clock, ns since the Unix epoch, UTC: the stored ``ts_ns``
                of a checkpoint, and what the last one's age is read against.

        Raises:
            ValueError: every_events < 1 or every_s <= 0.
            ChainIOError: the chain cannot be opened or written.
        """
        if every_events < 1:
            raise ValueError(f"checkpoint_every_events {every_events}: allowed 1 or more")
        if not every_s > 0:
            raise ValueError(f"checkpoint_every_s {every_s}: allowed > 0")
        self._path = os.fspath(path)
        self._node_id = node_id
        self._signer = signer
        self._every_events = every_events
        self._every_s = every_s
        self._monotonic = monotonic
        self._now_ns = now_ns
        self._conn = connect_writer(self._path)
        # A checkpoint's commit is not fsynced on its own: its WAL frames become
        # durable with the next event commit (synchronous=FULL on the chain's
        # connection syncs the shared WAL) or at `close`. A crash can lose the
        # latest checkpoint, never an event; the one before it still stands.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._tree = CompactTree()
        self._head = b""
        try:
            with translated(self._path, "open checkpoints of"), immediate(self._conn):
                create_table(self._conn)
                latest = latest_checkpoint(self._conn)
                self._resume(latest)
                age_s = self._age_s(latest)
        except BaseException:
            self._conn.close()
            raise
        self.last_size = 0 if latest is None else latest.tree_size
        self._last_at = monotonic() - age_s
        self._closed = False

    def _age_s(self, latest: StoredCheckpoint | None) -> float:
        """Seconds since the latest stored checkpoint was signed (else since the
        genesis), on the wall clock, >= 0 (a clock stepped back counts as now).

        The timer then runs on the monotonic clock from ``now - age``, so it
        counts across runs and is not moved by a step of the wall clock
        after boot."""
        if latest is not None:
            since = latest.ts_ns
        else:
            row = self._conn.execute("SELECT ts_ns FROM events WHERE seq = 0").fetchone()
            if row is None or type(row[0]) is not int:
                return 0.0
            since = row[0]
        return max(0.0, (self._now_ns() - since) / 1e9)

    def _resume(self, latest: StoredCheckpoint | None) -> None:
        """The tree of the stored events: from the latest checkpoint's frontier and the
        events after it when its root is the signed one, else from every event."""
        tree = None if latest is None else frontier_of(self._conn, latest.tree_size)
        if tree is not None and latest is not None:
            try:
                signed = read_checkpoint(latest.note, self._signer.verifier).root
            except CheckpointError:
                signed = b""
            if tree.root() == signed:
                self._tree = tree
                self._catch_up_from_db()
                return
        for digest in event_hashes(self._conn):
            self._tree.append(digest)
            self._head = digest

    def _catch_up_from_db(self) -> None:
        size = self._tree.size
        row = self._conn.execute("SELECT hash FROM events WHERE seq = ?", (size - 1,)).fetchone()
        self._head = bytes(row[0]) if row is not None else b""
        (last,) = self._conn.execute("SELECT coalesce(max(seq), -1) FROM events").fetchone()
        if last + 1 > size:
            self._catch_up(last + 1)

    @property
    def tree_size(self) -> int:
        """Events in the tree now."""
        return self._tree.size

    def observe(self, stored: Iterable[StoredEvent]) -> Checkpoint | None:
        """Add durable events (seq order) to the tree; sign a checkpoint when one is due.

        Returns:
            The checkpoint written, or None.

        Raises:
            ChainIOError: the checkpoint could not be stored.
        """
        for event in stored:
            if event.seq != self._tree.size:
                self._catch_up(event.seq)
            self._tree.append(event.hash)
            self._head = event.hash
        due = self._tree.size - self.last_size >= self._every_events or (
            self._tree.size > self.last_size and self._monotonic() - self._last_at >= self._every_s
        )
        return self.write() if due else None

    def _catch_up(self, seq: int) -> None:
        """Another writer appended events; read their hashes up to `seq` (exclusive)."""
        with translated(self._path, "read"):
            rows = self._conn.execute(
                "SELECT seq, hash FROM events WHERE seq >= ? AND seq < ? ORDER BY seq",
                (self._tree.size, seq),
            ).fetchall()
        for at, digest in rows:
            if at != self._tree.size:
                raise CheckpointError(f"chain {self._path}: seq {self._tree.size} is missing")
            self._tree.append(bytes(digest))
            self._head = bytes(digest)
        if self._tree.size != seq:
            raise CheckpointError(f"chain {self._path}: events before seq {seq} are missing")

    def write(self) -> Checkpoint | None:
        """Sign and store a checkpoint of the tree now, unless the latest already covers it."""
        self._last_at = self._monotonic()
        if self._tree.size <= self.last_size or self._closed:
            return None
        cp = sign_checkpoint(self._signer, self._tree.size, self._tree.root(), self._head)
        with translated(self._path, "store a checkpoint in"), immediate(self._conn):
            self._conn.execute(
                "INSERT INTO checkpoints (tree_size, ts_ns, note) VALUES (?, ?, ?)",
                (cp.tree_size, self._now_ns(), cp.note),
            )
            self._conn.execute(FRONTIERS)  # a chain made before frontiers were kept
            self._conn.execute(
                "INSERT OR REPLACE INTO checkpoint_frontiers (tree_size, frontier) VALUES (?, ?)",
                (cp.tree_size, self._tree.frontier()),
            )
        self.last_size = cp.tree_size
        return cp

    def close(self) -> Checkpoint | None:
        """Write a last checkpoint if events were added since the latest, then close.

        Idempotent. Returns the checkpoint written, or None.
        """
        if self._closed:
            return None
        try:
            with translated(self._path, "store a checkpoint in"):
                self._conn.execute("PRAGMA synchronous=FULL")  # the last one is durable
            return self.write()
        finally:
            self._closed = True
            self._conn.close()
