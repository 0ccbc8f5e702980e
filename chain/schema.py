"""The chain's SQLite schema: table, indexes, append-only triggers, views, format version.

The triggers make the database itself refuse a fork, a gap, an update or a
delete, whoever writes (this code, another process, a sqlite3 shell); a
writer checks them by their SQL text, not their names (`check_triggers`).
`PRAGMA user_version` holds the format version (0 means "not yet a chain").
The forensic views (`VIEWS`, docs/forensics.md) decode the JSON payloads into
columns; they and the forensic indexes are created with the schema and, for
chains made before they existed, when a writer opens the chain.
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
    prev_hash    BLOB NOT NULL CHECK (typeof(prev_hash) = 'blob' AND length(prev_hash) = 32),
    hash         BLOB NOT NULL UNIQUE CHECK (typeof(hash) = 'blob' AND length(hash) = 32)
)
"""

# prev_hash carries no UNIQUE index: the insert trigger makes each row's
# prev_hash the hash of the row before it, and hashes are UNIQUE, so no two rows
# can share one. An index on a random 32-byte key dirties a page of its own per
# row: dropping it made SQLite's own 32-row transactions about 1.45x faster on
# this schema (bench/README.md, "Group commit at the target"). Chains created
# before keep the index; both read and verify alike.
INDEXES = (
    "CREATE INDEX events_subject_seq ON events (subject, seq)",
    "CREATE INDEX events_kind_seq ON events (kind, seq)",
)

FORENSIC_INDEXES = (
    "CREATE INDEX IF NOT EXISTS events_ts ON events (ts_ns)",
    "CREATE INDEX IF NOT EXISTS events_source_seq ON events (source, seq)",
)
"""Indexes for the forensic filters (time, who); subject and kind have theirs above."""


def _iso(ts: str) -> str:
    """SQL: the ISO 8601 UTC text (millisecond precision) of integer ns `ts` (floor, exact)."""
    frac = f"((({ts} % 1000000000) + 1000000000) % 1000000000)"
    secs = f"(({ts} - {frac}) / 1000000000)"
    return (
        f"strftime('%Y-%m-%dT%H:%M:%S', {secs}, 'unixepoch') || '.' || "
        f"printf('%03d', {frac} / 1000000) || 'Z'"
    )


def _field(name: str) -> str:
    return f"json_extract(CAST(payload AS TEXT), '$.{name}')"


_LIVE = "('starting', 'running', 'unhealthy', 'restarting', 'stopping')"


def _json(payload: str, path: str) -> str:
    return f"json_extract(CAST({payload} AS TEXT), '{path}')"


def _next_state(prev: str, proc: str, kind: str, payload: str, rest: str) -> str:
    """SQL: the lifecycle state after an event of `kind` (replay/instance_rules.py `_target`);
    ``rest``: 1 while the stop in flight rests the instance (its ``then`` is ``rest``)."""
    then_rest = f"{_json(payload, '$.then')} = 'rest'"
    return f"""CASE {kind}
        WHEN 'instance.placed' THEN
            CASE WHEN {_json(payload, "$.spec.on_demand")} = 1 THEN 'resting' ELSE 'loaded' END
        WHEN 'instance.unloaded' THEN NULL
        WHEN 'instance.starting' THEN 'starting'
        WHEN 'instance.ready' THEN 'running'
        WHEN 'instance.recovered' THEN 'running'
        WHEN 'instance.unhealthy' THEN 'unhealthy'
        WHEN 'instance.restart_scheduled' THEN 'restarting'
        WHEN 'instance.failed' THEN 'failed'
        WHEN 'instance.finished' THEN 'finished'
        WHEN 'instance.exited' THEN
            CASE WHEN {prev} <> 'stopping' THEN 'exited'
                 WHEN {rest} THEN 'resting' ELSE 'stopped' END
        WHEN 'instance.stop_requested' THEN
            CASE WHEN {prev} = 'stopping' OR ({proc} AND {prev} IN {_LIVE}) THEN 'stopping'
                 WHEN {then_rest} THEN 'resting' ELSE 'stopped' END
        WHEN 'instance.exposed' THEN
            CASE WHEN {prev} = 'stopping' OR ({proc} AND {prev} IN {_LIVE})
                THEN 'stopping' ELSE 'stopped' END
        ELSE {prev} END"""


def _next_rest(rest: str, kind: str, payload: str) -> str:
    """SQL: 1 while the stop in flight rests the instance (replay/instance_rules.py `_on_stop`:
    a shutdown's stop leaves what follows as it was; a start clears it)."""
    then = f"coalesce({_json(payload, '$.then')}, '')"
    return f"""CASE {kind}
        WHEN 'instance.stop_requested' THEN
            CASE WHEN {then} = 'rest' THEN 1
                 WHEN {then} = '' AND {_json(payload, "$.by")} = 'shutdown' THEN {rest}
                 ELSE 0 END
        WHEN 'instance.starting' THEN 0
        WHEN 'instance.placed' THEN 0
        ELSE {rest} END"""


def _next_process(proc: str, kind: str) -> str:
    """SQL: 1 while the instance has a server process recorded (spawned, not yet exited)."""
    return f"""CASE {kind}
        WHEN 'instance.spawned' THEN 1
        WHEN 'instance.starting' THEN 0
        WHEN 'instance.exited' THEN 0
        WHEN 'instance.placed' THEN 0
        ELSE {proc} END"""


VIEWS = {
    "event_log": f"""
CREATE VIEW IF NOT EXISTS event_log AS
SELECT
    seq,
    {_iso("ts_ns")} AS time,
    ts_ns,
    node,
    source AS who,
    CASE WHEN instr(source, ':') > 0 THEN substr(source, 1, instr(source, ':') - 1)
         ELSE source END AS role,
    subject AS instance,
    kind,
    {_field("reason")} AS reason,
    {_field("by")} AS by_whom,
    {_field("exit_code")} AS exit_code,
    {_field("signal")} AS signal,
    {_field("pid")} AS pid,
    {_field("attempt")} AS attempt,
    {_field("delay_s")} AS delay_s,
    {_field("placed_by")} AS placed_by,
    {_field("detail")} AS detail,
    CAST(payload AS TEXT) AS payload,
    lower(hex(hash)) AS hash
FROM events
""",  # noqa: S608 - built from constants only
    "instance_states": f"""
CREATE VIEW IF NOT EXISTS instance_states AS
WITH RECURSIVE walk(seq, subject, from_state, to_state, process, rest) AS (
    SELECT e.seq, e.subject, NULL,
        {_next_state("NULL", "0", "e.kind", "e.payload", "0")},
        {_next_process("0", "e.kind")},
        {_next_rest("0", "e.kind", "e.payload")}
    FROM (SELECT subject, min(seq) AS first FROM events WHERE subject <> '' GROUP BY subject) f
    JOIN events e ON e.seq = f.first
    UNION ALL
    SELECT n.seq, n.subject, w.to_state,
        {_next_state("w.to_state", "w.process", "n.kind", "n.payload", "w.rest")},
        {_next_process("w.process", "n.kind")},
        {_next_rest("w.rest", "n.kind", "n.payload")}
    FROM walk w
    JOIN events n ON n.seq = (
        SELECT min(seq) FROM events WHERE subject = w.subject AND seq > w.seq)
)
SELECT seq, subject AS instance, from_state, to_state FROM walk
""",  # noqa: S608 - built from constants only
    "transitions": """
CREATE VIEW IF NOT EXISTS transitions AS
SELECT l.seq, l.time, l.ts_ns, l.instance, l.kind, s.from_state, s.to_state, l.reason,
       l.exit_code, l.signal, l.who, l.role, l.by_whom
FROM event_log l JOIN instance_states s ON s.seq = l.seq
""",
}
"""The forensic views (docs/forensics.md): `event_log` decodes every payload into
columns (ISO time, who, instance, reason, exit code, ...); `instance_states`
walks each instance's events to give the lifecycle state before and after
each (as replay/reducer.py does: `from_state` NULL before the placement,
`to_state` NULL after an unload); `transitions` joins the two."""


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
    ensure_forensics(conn)
    conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")


def ensure_forensics(conn: sqlite3.Connection) -> None:
    """Create the forensic indexes and views if missing (`IF NOT EXISTS`).

    Must run inside the caller's write transaction. Views and indexes are not
    part of what is verified; they only make the chain readable.
    """
    for statement in (*FORENSIC_INDEXES, *VIEWS.values()):
        conn.execute(statement)


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


def normalized_sql(sql: str) -> str:
    """`sql` with every run of whitespace made one space, stripped, no trailing ';'."""
    return " ".join(sql.split()).rstrip(";").rstrip()


def check_triggers(conn: sqlite3.Connection, path: str) -> None:
    """Refuse to append to a chain whose append-only triggers are not exactly ours.

    Compares each trigger's SQL text in `sqlite_master` (normalized by
    `normalized_sql`) with `TRIGGERS`, so a do-nothing trigger under the
    right name is refused like a dropped one; a trigger on `events` that is
    not one of ours is refused too.

    Raises:
        ChainFormatError: a trigger is missing, altered or added (the file was
            tampered with outside infervisor), naming it.
    """
    problems = trigger_problems(conn)
    if problems:
        raise ChainFormatError(
            f"chain {path}: its append-only triggers were changed outside infervisor "
            f"({'; '.join(problems)}); the chain may have been tampered with: check it "
            f"with `infervisor chain verify {path}` and keep it as evidence"
        )


def trigger_problems(conn: sqlite3.Connection) -> list[str]:
    """What is wrong with the events table's append-only triggers, by their SQL
    ([]: exactly ``TRIGGERS``): ``missing [...]``, ``altered [...]``, ``not ours [...]``."""
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"
    ).fetchall()
    found = {_text(name): normalized_sql(_text(sql or "")) for name, sql in rows}
    missing = sorted(set(TRIGGERS) - set(found))
    altered = sorted(
        name
        for name, sql in TRIGGERS.items()
        if name in found and found[name] != normalized_sql(sql)
    )
    added = sorted(set(found) - set(TRIGGERS))
    return [
        f"{what} {names}"
        for what, names in (("missing", missing), ("altered", altered), ("not ours", added))
        if names
    ]


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


def _text(value: object) -> str:
    """A name or SQL read as text (a verifier's connection reads TEXT as bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
