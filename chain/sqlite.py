"""`SqliteChain`: the chain in a SQLite file (WAL, synchronous=FULL).

One writer connection per `SqliteChain`, used under a lock; every append is a
`BEGIN IMMEDIATE` transaction that reads the head inside the transaction, so
a second writer (another process) can interleave but never fork the chain.
Readers (`events()`, `open_readonly`) use their own read-only connections and
never block the writer.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from infervisor.chain import schema
from infervisor.chain.connect import connect_reader, connect_writer, immediate, translated
from infervisor.chain.errors import ChainFormatError, ChainIOError, NodeMismatch
from infervisor.chain.hashing import seal_after, seal_genesis
from infervisor.chain.records import (
    GENESIS_KIND,
    EventDraft,
    StoredEvent,
    check_drafts,
    check_node_id,
)
from infervisor.chain.store import Closing, KindFilter, kinds_filter


class SqliteChain(Closing):
    """A node's chain in a SQLite file. Use `open` (writer) or `open_readonly`.

    Thread-safe: calls on one instance are serialised by a lock.

    Attributes:
        node_id: the node named by the chain's genesis event.
        path: the chain file.
    """

    def __init__(self, conn: sqlite3.Connection, path: str, node_id: str, *, writable: bool):
        """Wrap an open connection; callers use `open` or `open_readonly` instead."""
        self._conn = conn
        self.path = path
        self.node_id = node_id
        self._writable = writable
        self._lock = threading.Lock()
        self._closed = False
        # The head this connection last committed, so an append need not read it
        # back. If another writer appended meanwhile, the insert trigger refuses
        # the stale link (at the first row: its seq is taken) and the append is
        # sealed again on the head read in the same transaction.
        self._head: StoredEvent | None = None

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        node_id: str,
        *,
        now_ns: Callable[[], int] = time.time_ns,
    ) -> SqliteChain:
        """Open `node_id`'s chain for appending, creating it if the file is new.

        A new chain gets the schema and its genesis event (seq 0) stamped with
        `now_ns()`. Blocks up to `connect.BUSY_TIMEOUT_S` while another process
        holds the write lock.

        Args:
            path: the chain file (created if missing; its directory must exist).
            node_id: this node's id; must match the genesis of an existing chain.
            now_ns: clock for the genesis timestamp, ns since the Unix epoch, UTC.

        Raises:
            InvalidEventError: `node_id` is empty or not valid UTF-8.
            NodeMismatch: the existing chain belongs to another node.
            ChainFormatError: the file is SQLite but not a chain of this format,
                or its append-only triggers were removed or altered (checked by
                their SQL, not their names).
            ChainIOError: the file cannot be opened or written.
        """
        node_id = check_node_id(node_id)
        name = os.fspath(path)
        conn = connect_writer(name)
        try:
            with translated(name, "open"), immediate(conn):
                _create_or_check(conn, name, node_id, now_ns)
        except BaseException:
            conn.close()
            raise
        return cls(conn, name, node_id, writable=True)

    @classmethod
    def open_readonly(cls, path: str | os.PathLike[str]) -> SqliteChain:
        """Open an existing chain for reading only; nothing is ever written.

        Raises:
            ChainFormatError: the file is not a chain of this format.
            ChainIOError: the file is missing or unreadable.
        """
        name = os.fspath(path)
        conn = connect_reader(name)
        try:
            with translated(name, "read"):
                node_id = _existing_node(conn, name)
        except BaseException:
            conn.close()
            raise
        return cls(conn, name, node_id, writable=False)

    def append(self, draft: EventDraft) -> StoredEvent:
        """Append one event; durable (fsynced) when it returns. See `append_many`."""
        return self.append_many([draft])[0]

    def append_many(self, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        """Append events in order in one transaction; durable when it returns.

        Returns:
            The stored events, in the order of `drafts` ([] for no drafts).

        Raises:
            InvalidEventError: a draft cannot be stored; nothing was appended.
            ChainIntegrityError: the database refused the rows (fork or gap).
            ChainIOError: closed, read-only, locked too long, or a write failed.
        """
        checked = check_drafts(drafts)
        if not checked:
            return []
        with self._lock, translated(self.path, "append to"):
            self._check_writable()
            head, self._head = self._head, None  # re-read after any failure
            with immediate(self._conn):
                try:
                    stored = self._insert(head or read_head(self._conn), checked)
                except sqlite3.IntegrityError:
                    if head is None:
                        raise
                    stored = self._insert(read_head(self._conn), checked)  # another writer's
            self._head = stored[-1]
        return stored

    def _insert(self, head: StoredEvent, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        stored = seal_after(head, drafts, self.node_id)
        if len(stored) == 1:  # the common case; executemany costs a few microseconds more
            self._conn.execute(schema.INSERT_EVENT, schema.to_row(stored[0]))
        else:
            self._conn.executemany(schema.INSERT_EVENT, [schema.to_row(e) for e in stored])
        return stored

    def head(self) -> StoredEvent:
        """Return the event with the highest seq, as committed now.

        Raises:
            ChainIOError: closed or unreadable.
        """
        with self._lock, translated(self.path, "read"):
            self._check_open()
            return read_head(self._conn)

    def events(
        self, *, after: int = -1, subject: str | None = None, kinds: KindFilter = None
    ) -> Iterator[StoredEvent]:
        """Stream events with seq > `after` matching the filters, ordered by seq.

        Reads through its own read-only connection, opened on the first
        `next()` and closed when the iterator is exhausted or closed. It sees
        the chain as committed at that moment.

        Args:
            after: only events with a greater seq (-1: from genesis).
            subject: only events of this subject ("" for node-level events).
            kinds: only events whose kind is in this collection.

        Raises:
            ChainIOError: the chain is closed (at the call), or cannot be read
                (while iterating).
        """
        with self._lock:
            self._check_open()
        wanted = kinds_filter(kinds)
        if wanted is not None and not wanted:
            return iter(())
        sql, params = schema.events_query(after, subject, wanted)
        return self._stream(sql, params)

    def close(self) -> None:
        """Close the connection; idempotent. Open iterators keep working."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def _stream(self, sql: str, params: list[Any]) -> Iterator[StoredEvent]:
        with translated(self.path, "read"):
            conn = connect_reader(self.path)
            try:
                for row in conn.execute(sql, params):
                    yield schema.to_event(row)
            finally:
                conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ChainIOError(f"chain {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise ChainIOError(
                f"chain {self.path} was opened read-only; use SqliteChain.open to append"
            )


def read_head(conn: sqlite3.Connection) -> StoredEvent:
    """Return the event with the highest seq.

    Raises:
        ChainFormatError: the table is empty.
    """
    row = conn.execute(schema.SELECT_EVENTS + " ORDER BY seq DESC LIMIT 1").fetchone()
    if row is None:
        raise ChainFormatError("chain has no events, not even its genesis")
    return schema.to_event(row)


def _create_or_check(
    conn: sqlite3.Connection, path: str, node_id: str, now_ns: Callable[[], int]
) -> None:
    if schema.check_version(conn, path) == 0:
        schema.create(conn)
        genesis = seal_genesis(node_id, now_ns())
        conn.execute(schema.INSERT_EVENT, schema.to_row(genesis))
        return
    schema.check_triggers(conn, path)
    found = _genesis_node(conn, path)
    if found != node_id:
        raise NodeMismatch(path, node_id, found)
    schema.ensure_forensics(conn)


def _existing_node(conn: sqlite3.Connection, path: str) -> str:
    if schema.check_version(conn, path) == 0:
        raise ChainFormatError(f"{path} is not an infervisor chain (empty database)")
    return _genesis_node(conn, path)


def _genesis_node(conn: sqlite3.Connection, path: str) -> str:
    row = conn.execute("SELECT node, kind FROM events WHERE seq = 0").fetchone()
    if row is None or row[1] != GENESIS_KIND:
        raise ChainFormatError(f"chain {path} has no genesis event at seq 0")
    return str(row[0])
