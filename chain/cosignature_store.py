"""Witness cosignatures kept in the chain's database, beside the checkpoints.

The `cosignatures` table holds each cosignature/v1 line a witness returned for
a stored checkpoint (docs/chain-format.md, "Cosignatures"). Like `events` and
`checkpoints` it is append-only: triggers refuse an update, a delete, and a
cosignature of a checkpoint that is not stored::

    CREATE TABLE cosignatures (
        tree_size   INTEGER NOT NULL,  -- the checkpoint cosigned
        witness     TEXT NOT NULL,     -- the witness's key name
        key_id      BLOB NOT NULL,     -- its 4-byte key ID
        timestamp_s INTEGER NOT NULL,  -- the cosignature's time, POSIX seconds
        line        TEXT NOT NULL,     -- the signature line, no newline
        PRIMARY KEY (tree_size, witness, key_id)
    );

Nothing here verifies a line: a reader checks them against its own witness
policy (chain/cosignature.py `cosignatures_of`), trusting nothing the table
says.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable

from infervisor.chain.connect import connect_writer, immediate, read_only, translated
from infervisor.chain.cosignature import Cosignature, with_cosignatures

TABLE = """
CREATE TABLE IF NOT EXISTS cosignatures (
    tree_size   INTEGER NOT NULL CHECK (typeof(tree_size) = 'integer' AND tree_size >= 1),
    witness     TEXT NOT NULL CHECK (typeof(witness) = 'text'),
    key_id      BLOB NOT NULL CHECK (typeof(key_id) = 'blob' AND length(key_id) = 4),
    timestamp_s INTEGER NOT NULL CHECK (typeof(timestamp_s) = 'integer'),
    line        TEXT NOT NULL CHECK (typeof(line) = 'text'),
    PRIMARY KEY (tree_size, witness, key_id)
)
"""

TRIGGERS = (
    """
CREATE TRIGGER IF NOT EXISTS cosignatures_of_stored_checkpoints BEFORE INSERT ON cosignatures
BEGIN
    SELECT RAISE(ABORT, 'chain: a cosignature must be of a stored checkpoint')
    WHERE NOT EXISTS (SELECT 1 FROM checkpoints WHERE tree_size = NEW.tree_size);
END
""",
    """
CREATE TRIGGER IF NOT EXISTS cosignatures_append_only_update BEFORE UPDATE ON cosignatures
BEGIN
    SELECT RAISE(ABORT, 'chain: cosignatures are append-only; UPDATE refused');
END
""",
    """
CREATE TRIGGER IF NOT EXISTS cosignatures_append_only_delete BEFORE DELETE ON cosignatures
BEGIN
    SELECT RAISE(ABORT, 'chain: cosignatures are append-only; DELETE refused');
END
""",
)


def create_table(conn: sqlite3.Connection) -> None:
    """Create the cosignatures table and its triggers if missing (in a write transaction)."""
    conn.execute(TABLE)
    for trigger in TRIGGERS:
        conn.execute(trigger)


def has_table(conn: sqlite3.Connection) -> bool:
    """Return True if the database has a cosignatures table."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cosignatures'"
    ).fetchone()
    return row is not None


def store(path: str | os.PathLike[str], tree_size: int, cosignatures: Iterable[Cosignature]) -> int:
    """Add cosignatures of the stored checkpoint of `tree_size`, durably (fsynced).

    A cosignature already stored (same checkpoint, witness and key) is kept as
    it was. Returns how many rows were added.

    Raises:
        ChainIntegrityError: no checkpoint of `tree_size` is stored.
        ChainIOError: the file cannot be written.
    """
    name = os.fspath(path)
    rows = [(tree_size, c.witness, c.key_id, c.timestamp_s, c.line) for c in cosignatures]
    conn = connect_writer(name)
    try:
        with translated(name, "store cosignatures in"), immediate(conn):
            create_table(conn)
            before = conn.total_changes
            conn.executemany("INSERT OR IGNORE INTO cosignatures VALUES (?, ?, ?, ?, ?)", rows)
            return conn.total_changes - before
    finally:
        conn.close()


def lines_by_size(conn: sqlite3.Connection) -> dict[int, list[str]]:
    """Return tree size -> cosignature lines of each cosigned checkpoint ({} without the table)."""
    if not has_table(conn):
        return {}
    found: dict[int, list[str]] = {}
    for size, line in conn.execute(
        "SELECT tree_size, line FROM cosignatures ORDER BY tree_size, witness"
    ):
        found.setdefault(int(size), []).append(_text(line))
    return found


def witness_sizes(conn: sqlite3.Connection) -> dict[str, int]:
    """Return each witness's name -> the largest tree size it has cosigned here (unverified)."""
    if not has_table(conn):
        return {}
    rows = conn.execute("SELECT witness, max(tree_size) FROM cosignatures GROUP BY witness")
    return {_text(witness): int(size) for witness, size in rows}


def cosigned_note(conn: sqlite3.Connection, tree_size: int) -> str | None:
    """Return the stored checkpoint of `tree_size` with its cosignature lines appended, or None."""
    row = conn.execute("SELECT note FROM checkpoints WHERE tree_size = ?", (tree_size,)).fetchone()
    if row is None:
        return None
    lines: list[str] = []
    if has_table(conn):
        query = "SELECT line FROM cosignatures WHERE tree_size = ? ORDER BY witness"
        lines = [_text(line) for (line,) in conn.execute(query, (tree_size,))]
    return with_cosignatures(_text(row[0]), lines)


def read_lines_by_size(path: str | os.PathLike[str]) -> dict[int, list[str]]:
    """`lines_by_size` of the chain file at `path`, opened read-only.

    Raises:
        ChainIOError: the file cannot be read.
    """
    return read_only(path, "read cosignatures of", lines_by_size)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
