"""The auditor's bare loop, as its own process: the reference the CLI's chain reads
are measured against (bench/cli_audit.py).

What an auditor writes from docs/chain-format.md with sqlite3 and blake3 alone:
read the rows ``ORDER BY seq``, BLAKE3 the payload, build the header, BLAKE3
it, compare both hashes and the link to the previous row. It imports nothing
of infervisor (its start-up is Python's, sqlite3's and blake3's), and prints
the number of rows that checked out.

Run: ``python bench/_bare_verify.py CHAIN.db``.
"""

from __future__ import annotations

import sqlite3
import struct
import sys

import blake3

PAYLOAD_CONTEXT = "infervisor 2026-11 chain payload v1"
EVENT_CONTEXT = "infervisor 2026-11 chain event v1"
ROWS = (
    "SELECT seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, hash "
    "FROM events ORDER BY seq"
)


def main(path: str) -> int:
    """Verify ``path``'s rows; returns how many checked out (exits 1 at the first bad one)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = bytes
    seq_ts, length = struct.Struct(">Qq").pack, struct.Struct(">I").pack
    b3 = blake3.blake3
    n = 0
    prev_hash = bytes(32)
    for seq, ts, node, source, kind, subject, payload, ph, prev, digest in conn.execute(ROWS):
        if b3(payload, derive_key_context=PAYLOAD_CONTEXT).digest() != ph:
            sys.exit(f"payload altered at {seq}")
        if prev != prev_hash:
            sys.exit(f"link broken at {seq}")
        header = b"".join(
            (
                seq_ts(seq, ts),
                length(len(node)),
                node,
                length(len(source)),
                source,
                length(len(kind)),
                kind,
                length(len(subject)),
                subject,
                ph,
                prev,
            )
        )
        if b3(header, derive_key_context=EVENT_CONTEXT).digest() != digest:
            sys.exit(f"header altered at {seq}")
        prev_hash = digest
        n += 1
    conn.close()
    return n


if __name__ == "__main__":
    print(main(sys.argv[1]))
