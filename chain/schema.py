"""The chain's SQLite schema: table, indexes, append-only triggers, format version.

The triggers make the database itself refuse a fork, a gap, an update or a
delete, whoever writes (this code, another process, a sqlite3 shell).
`PRAGMA user_version` holds the format version (0 means "not yet a chain").
"""

from __future__ import annotations

import sqlite3
from typing import Any

from infervisor.chain.errors import ChainFormatError
from infervisor.chain.records import FORMAT_VERSION, StoredEvent

COLUMNS = (
    "seq",
    "ts_ns",
    "node",
    "source",
    "kind",
    "subject",
    "payload",
    "payload_hash",
    "prev_hash",
    "hash",
)
"""The event columns, in the order rows are read and written."""

SELECT_EVENTS = (
    "SELECT seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, hash "
    "FROM events"
)
INSERT_EVENT = (
    "INSERT INTO events "
    "(seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

TABLE = """
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY CHECK (seq >= 0),
    ts_ns        INTEGER NOT NULL CHECK (typeof(ts_ns) = 'integer'),
    node         TEXT NOT NULL CHECK (typeof(node) = 'text'),
    source       TEXT NOT NULL CHECK (typeof(source) = 'text'),
    kind         TEXT NOT NULL CHECK (typeof(kind) = 'text'),
    subject      TEXT NOT NULL CHECK (typeof(subject) = 'text'),
    payload      BLOB NOT NULL CHECK (typeof(payload) = 'blob'),
    payload_hash BLOB NOT NULL CHECK (typeof(payload_hash) = 'blob' AND length(payload_hash) = 32),
    prev_hash    BLOB NOT NULL UNIQUE CHECK (typeof(prev_hash) = 'blob' AND length(prev_hash) = 32),
    hash         BLOB NOT NULL UNIQUE CHECK (typeof(hash) = 'blob' AND length(hash) = 32)
)
"""

INDEXES = (
    "CREATE INDEX events_subject_seq ON events (subject, seq)",
    "CREATE INDEX events_kind_seq ON events (kind, seq)",
)

TRIGGERS = {
    "events_append_only_insert": """
CREATE TRIGGER events_append_only_insert BEFORE INSERT ON events
BEGIN
    SELECT RAISE(ABORT, 'chain: seq must be the head seq + 1 (0 for genesis)')
    WHERE NEW.seq IS NOT (SELECT coalesce(max(seq), -1) + 1 FROM events);
    SELECT RAISE(ABORT, 'chain: prev_hash must be the hash of the head (zeros for genesis)')
    WHERE NEW.prev_hash IS NOT
        coalesce((SELECT hash FROM events WHERE seq = NEW.seq - 1), zeroblob(32));
    SELECT RAISE(ABORT, 'chain: hash already stored; INSERT OR REPLACE cannot delete events')
    WHERE EXISTS (SELECT 1 FROM events WHERE hash = NEW.hash);
END
""",
    "events_append_only_update": """
CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'chain: events are append-only; UPDATE refused');
END
""",
    "events_append_only_delete": """
CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'chain: events are append-only; DELETE refused');
END
""",
}


def create(conn: sqlite3.Connection) -> None:
    """Create the table, indexes and triggers and stamp the format version.

    Must run inside the caller's write transaction, on an empty database.
    """
    for statement in (TABLE, *INDEXES, *TRIGGERS.values()):
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")


def is_empty(conn: sqlite3.Connection) -> bool:
    """Return True if the database has no schema at all (a new file)."""
    return conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None


def check_version(conn: sqlite3.Connection, path: str) -> int:
    """Return the format version; 0 for an empty database.

    Raises:
        ChainFormatError: a non-empty database of version 0 (not a chain), or a
            version this code does not read.
    """
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == 0 and not is_empty(conn):
        raise ChainFormatError(
            f"{path} is a SQLite database but not an infervisor chain (user_version 0, "
            "tables present); give the chain a file of its own"
        )
    if version not in (0, FORMAT_VERSION):
        raise ChainFormatError(
            f"chain {path} has format version {version}; this code reads version "
            f"{FORMAT_VERSION} only"
        )
    return version


def check_triggers(conn: sqlite3.Connection, path: str) -> None:
    """Refuse to append to a chain whose append-only triggers are gone.

    Raises:
        ChainFormatError: a trigger is missing (the file was tampered with).
    """
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
    missing = sorted(set(TRIGGERS) - {name for (name,) in rows})
    if missing:
        raise ChainFormatError(
            f"chain {path} lacks its append-only triggers {missing}: it was altered "
            "outside infervisor; verify it before use"
        )


def events_query(
    after: int, subject: str | None, kinds: frozenset[str] | None
) -> tuple[str, list[Any]]:
    """Return the SQL and parameters of `Chain.events` (kinds already a set)."""
    clauses: list[str] = ["seq > ?"]
    params: list[Any] = [after]
    if subject is not None:
        clauses.append("subject = ?")
        params.append(subject)
    if kinds is not None:
        clauses.append(f"kind IN ({', '.join('?' * len(kinds))})")
        params.extend(sorted(kinds))
    return f"{SELECT_EVENTS} WHERE {' AND '.join(clauses)} ORDER BY seq", params


def to_row(event: StoredEvent) -> tuple[Any, ...]:
    """Return `event` as INSERT_EVENT parameters."""
    return (
        event.seq,
        event.ts_ns,
        event.node,
        event.source,
        event.kind,
        event.subject,
        event.payload,
        event.payload_hash,
        event.prev_hash,
        event.hash,
    )


def to_event(row: tuple[Any, ...]) -> StoredEvent:
    """Return a row read with SELECT_EVENTS as a `StoredEvent` (not verified)."""
    seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, digest = row
    return StoredEvent(
        seq=seq,
        ts_ns=ts_ns,
        node=node,
        source=source,
        kind=kind,
        subject=subject,
        payload=payload,
        payload_hash=payload_hash,
        prev_hash=prev_hash,
        hash=digest,
    )
