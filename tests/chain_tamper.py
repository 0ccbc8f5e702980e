"""Helpers of the checkpoint, bundle and boot-check tests: small chains, signed and tampered."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from infervisor.chain import EventDraft, SqliteChain, encode_payload
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.chain.hashing import event_hash, header_bytes, payload_hash

NOW = 1_793_491_200_000_000_000
NODE = "node-a"


def draft(n: int, tag: str = "") -> EventDraft:
    return EventDraft(
        ts_ns=NOW + n,
        source="operator",
        kind="test.event",
        subject=f"inst-{n % 2}",
        payload=encode_payload({"n": n, "tag": tag}),
    )


def make_chain(
    folder: Path, events: int, *, every: int = 4, tag: str = "", fork_at: int | None = None
) -> Path:
    """A chain of `events` rows (genesis included) in folder/chain.db, checkpointed every
    `every` events and at the end; from seq `fork_at` on the payloads carry another tag."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chain.db"
    signer = load_or_create_signer(folder, NODE)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        cp = Checkpointer(path, NODE, signer, every_events=every, every_s=1e9, now_ns=lambda: NOW)
        for n in range(1, events):
            mark = tag if fork_at is None or n < fork_at else tag + "-fork"
            cp.observe(chain.append_many([draft(n, mark)]))
        cp.close()
    return path


def _triggers(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"
    ).fetchall()
    return [(str(n), str(s)) for n, s in rows]


def _untriggered(path: Path) -> tuple[sqlite3.Connection, list[tuple[str, str]]]:
    conn = sqlite3.connect(path, isolation_level=None)
    saved = _triggers(conn)
    for name, _ in saved:
        conn.execute(f"DROP TRIGGER {name}")
    return conn, saved


def _restore(conn: sqlite3.Connection, saved: list[tuple[str, str]]) -> None:
    for _, sql in saved:
        conn.execute(sql)
    conn.close()


def truncate(path: Path, keep: int) -> None:
    """Delete every row with seq >= keep (triggers dropped, then put back as they were)."""
    conn, saved = _untriggered(path)
    conn.execute("DELETE FROM events WHERE seq >= ?", (keep,))
    _restore(conn, saved)


def alter_payload(path: Path, seq: int) -> None:
    """Change one payload in place; its hashes stay (an in-place tamper)."""
    conn, saved = _untriggered(path)
    conn.execute(
        "UPDATE events SET payload = ? WHERE seq = ?", (encode_payload({"forged": True}), seq)
    )
    _restore(conn, saved)


def rewrite_from(path: Path, seq: int, payload: bytes | None = None) -> None:
    """Change the payload at `seq` (to `payload`, default a forged mapping) and re-hash
    it and every later row: verifies as a chain."""
    forged = encode_payload({"rewritten": True}) if payload is None else payload
    conn, saved = _untriggered(path)
    rows = conn.execute(
        "SELECT seq, ts_ns, node, source, kind, subject, payload, prev_hash FROM events "
        "WHERE seq >= ? ORDER BY seq",
        (seq,),
    ).fetchall()
    prev = bytes(rows[0][7])
    for at, ts, node, source, kind, subject, stored, _ in rows:
        payload = forged if at == seq else stored
        digest = payload_hash(payload)
        fields = (node.encode(), source.encode(), kind.encode(), subject.encode())
        head = header_bytes(seq=at, ts_ns=ts, fields=fields, payload_digest=digest, prev_hash=prev)
        new = event_hash(head)
        conn.execute(
            "UPDATE events SET payload = ?, payload_hash = ?, prev_hash = ?, hash = ? "
            "WHERE seq = ?",
            (payload, digest, prev, new, at),
        )
        prev = new
    _restore(conn, saved)
