"""Independent verifier of an infervisor chain, written from docs/chain-format.md alone.

Usage: python tests/independent_verifier.py CHAIN.db

Prints "ok <events> <head-hash-hex>" (exit 0) or "bad <seq> <reason>" (exit 1);
exit 2 if the file cannot be read as a chain. Imports no infervisor code.
"""

import json
import sqlite3
import struct
import sys

import blake3

PAYLOAD_CTX = "infervisor 2026-11 chain payload v1"
EVENT_CTX = "infervisor 2026-11 chain event v1"
ZERO = bytes(32)
ROWS = (
    "SELECT seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, hash "
    "FROM events ORDER BY seq"
)


class BadRowError(Exception):
    """The first problem: the seq it was found at and the reason (docs section 5)."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"bad {seq} {reason}")
        self.seq, self.reason = seq, reason


def well_formed(row: tuple, expected: int) -> None:
    """Step 0: raise unless every column has the type and size the format allows."""
    seq = row[0] if isinstance(row[0], int) else expected
    ints_ok = all(isinstance(v, int) for v in row[:2]) and row[0] >= 0
    if not ints_ok or not all(isinstance(v, bytes) for v in row[2:]):
        raise BadRowError(seq, "malformed row")
    try:
        for text in row[2:6]:
            text.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRowError(seq, "malformed row") from None
    if any(len(h) != 32 for h in row[7:]):
        raise BadRowError(seq, "malformed row")


def event_hash(seq: int, ts_ns: int, texts: tuple, payload_hash: bytes, prev_hash: bytes) -> bytes:
    """BLAKE3 derive_key (event context) of the header: section 4."""
    data = struct.pack(">Qq", seq, ts_ns)
    for text in texts:
        data += struct.pack(">I", len(text)) + text
    return blake3.blake3(data + payload_hash + prev_hash, derive_key_context=EVENT_CTX).digest()


def genesis_ok(kind: bytes, node: bytes, payload: bytes, source: bytes, subject: bytes) -> bool:
    """Step 6 for seq 0: kind chain.genesis, source node, subject empty, the payload naming
    this node."""
    if kind != b"chain.genesis" or source != b"node" or subject != b"":
        return False
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    want = {"format": 1, "hash": "blake3", "node": node.decode("utf-8")}
    return isinstance(doc, dict) and type(doc.get("format")) is int and doc == want


def check(db: sqlite3.Connection, row: tuple, prev: tuple | None, genesis_node: bytes) -> None:
    """Steps 1 to 6 for one well-formed row; `prev` is (seq, hash) of the row before."""
    seq, ts_ns, node, source, kind, subject, payload, p_hash, prev_hash, digest = row
    expected = 0 if prev is None else prev[0] + 1
    if seq < expected:
        raise BadRowError(seq, "duplicate" if prev is not None and seq == prev[0] else "reordered")
    if seq > expected:
        exists = db.execute("SELECT 1 FROM events WHERE seq = ?", (expected,)).fetchone()
        raise BadRowError(seq, "reordered" if exists else "gap")
    if blake3.blake3(payload, derive_key_context=PAYLOAD_CTX).digest() != p_hash:
        raise BadRowError(seq, "payload altered")
    if prev_hash != (ZERO if prev is None else prev[1]):
        later = db.execute(
            "SELECT 1 FROM events WHERE hash = ? AND typeof(seq) = 'integer' AND seq > ?",
            (prev_hash, seq),
        ).fetchone()
        raise BadRowError(
            seq, "reordered" if later else "bad genesis" if prev is None else "link broken"
        )
    if event_hash(seq, ts_ns, (node, source, kind, subject), p_hash, prev_hash) != digest:
        raise BadRowError(seq, "header altered")
    if prev is None and not genesis_ok(kind, node, payload, source, subject):
        raise BadRowError(seq, "bad genesis")
    if prev is not None and node != genesis_node:
        raise BadRowError(seq, "header altered")
    if prev is not None and kind == b"chain.genesis":
        raise BadRowError(seq, "bad genesis")


def verify(path: str) -> tuple:
    """Return ("ok", events, head_hex) or ("bad", seq, reason)."""
    quoted = path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    db = sqlite3.connect("file:" + quoted + "?mode=ro", uri=True)
    db.text_factory = bytes
    try:
        db.execute("BEGIN")
        columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
        if not columns:
            raise sqlite3.DatabaseError("no table events")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version != 1:  # section 1: the format version
            raise sqlite3.DatabaseError(f"format version {version}, not 1")
        prev, genesis_node, count = None, None, 0
        for row in db.execute(ROWS):
            try:
                well_formed(row, 0 if prev is None else prev[0] + 1)
                check(db, row, prev, genesis_node)
            except BadRowError as bad:
                return ("bad", bad.seq, bad.reason)
            if prev is None:
                genesis_node = row[2]
            prev, count = (row[0], row[9]), count + 1
        if prev is None:
            return ("bad", 0, "bad genesis")
        return ("ok", count, prev[1].hex())
    finally:
        db.close()


def main(argv: list) -> int:
    if len(argv) != 2:
        print("usage: independent_verifier.py CHAIN.db", file=sys.stderr)
        return 2
    try:
        verdict = verify(argv[1])
    except sqlite3.Error as exc:
        print(f"error {exc}", file=sys.stderr)
        return 2
    print(*verdict)
    return 0 if verdict[0] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
