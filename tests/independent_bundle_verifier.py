"""Independent verifier of export bundles and checkpoints, from docs/chain-format.md alone.

Usage:
    python tests/independent_bundle_verifier.py BUNDLE_DIR [PUBKEY]
    python tests/independent_bundle_verifier.py --db CHAIN.db CHECKPOINT_FILE PUBKEY

Prints "ok <events> <head-hash-hex>" (exit 0) or "bad <seq> <reason>" (exit 1;
"bad - manifest <field>" for a claim of the manifest the contents contradict);
exit 2 when the input cannot be read. Imports no infervisor code: the
Merkle tree is tests/independent_rfc6962.py (from RFC 6962), the signature
check tests/independent_note.py (from c2sp.org/signed-note).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import struct
import sys
from pathlib import Path

import blake3

sys.path.insert(0, str(Path(__file__).parent))
import independent_note
import independent_rfc6962

PAYLOAD_CTX = "infervisor 2026-11 chain payload v1"
EVENT_CTX = "infervisor 2026-11 chain event v1"
ZERO = bytes(32)


class Bad(Exception):
    def __init__(self, seq: int | str, reason: str) -> None:
        super().__init__(f"bad {seq} {reason}")
        self.seq, self.reason = seq, reason


def header_hash(row: dict) -> bytes:
    data = struct.pack(">Qq", row["seq"], row["ts_ns"])
    for name in ("node", "source", "kind", "subject"):
        text = row[name].encode("utf-8")
        data += struct.pack(">I", len(text)) + text
    data += row["payload_hash"] + row["prev_hash"]
    return blake3.blake3(data, derive_key_context=EVENT_CTX).digest()


def check_rows(rows: list[dict]) -> None:
    """Section 5 of the format, over rows already in memory."""
    seqs = {r["seq"] for r in rows}
    later = {r["hash"]: r["seq"] for r in rows}
    prev = None
    for row in rows:
        seq = row["seq"]
        expected = 0 if prev is None else prev["seq"] + 1
        if seq < expected:
            raise Bad(seq, "duplicate" if prev is not None and seq == prev["seq"] else "reordered")
        if seq > expected:
            raise Bad(seq, "reordered" if expected in seqs else "gap")
        if (
            blake3.blake3(row["payload"], derive_key_context=PAYLOAD_CTX).digest()
            != row["payload_hash"]
        ):
            raise Bad(seq, "payload altered")
        want = ZERO if prev is None else prev["hash"]
        if row["prev_hash"] != want:
            if later.get(row["prev_hash"], -1) > seq:
                raise Bad(seq, "reordered")
            raise Bad(seq, "bad genesis" if prev is None else "link broken")
        if header_hash(row) != row["hash"]:
            raise Bad(seq, "header altered")
        if prev is None:
            doc = json.loads(row["payload"])
            want_doc = {"format": 1, "hash": "blake3", "node": row["node"]}
            if row["kind"] != "chain.genesis" or doc != want_doc or type(doc["format"]) is not int:
                raise Bad(seq, "bad genesis")
            node = row["node"]
        else:
            if row["node"] != node:
                raise Bad(seq, "header altered")
            if row["kind"] == "chain.genesis":
                raise Bad(seq, "bad genesis")
        prev = row
    if prev is None:
        raise Bad(0, "bad genesis")


def checkpoint_values(note: bytes, vkey: str) -> tuple[str, int, bytes, bytes]:
    """(origin, tree size, root, head hash) of a checkpoint whose signature verifies."""
    text = independent_note.verify_note(note, vkey)
    origin, size, root, ext, end = text.split("\n")
    word, head_seq, head = ext.split(" ")
    if end or word != "infervisor-chain-head" or int(head_seq) != int(size) - 1:
        raise ValueError("not an infervisor checkpoint")
    return origin, int(size), base64.b64decode(root), bytes.fromhex(head)


def against(hashes: list[bytes], checkpoints: list[tuple[int, bytes, bytes]]) -> None:
    """(size, root, head) checkpoints against the chain's event hashes: the largest names
    the failure, the smaller ones that still match say from which seq on it differs."""
    ordered = sorted(checkpoints)
    matching = [0] + [
        size
        for size, root, _ in ordered
        if size <= len(hashes) and independent_rfc6962.mth(hashes[:size]) == root
    ]
    for size, root, head in [ordered[-1], *ordered[:-1]]:
        if len(hashes) < size:
            raise Bad(len(hashes), "truncated")
        if independent_rfc6962.mth(hashes[:size]) != root:
            since = max(s for s in matching if s < size)
            raise Bad(since, "rewritten" if len(hashes) == size else "forked")
        if hashes[size - 1] != head:
            raise Bad(size - 1, "head mismatch")


def bundle(folder: Path, vkey: str | None) -> tuple[int, bytes]:
    rows = []
    for line in (folder / "events.jsonl").read_bytes().splitlines():
        doc = json.loads(line)
        for name in ("payload_hash", "prev_hash", "hash"):
            doc[name] = bytes.fromhex(doc[name])
        doc["payload"] = base64.b64decode(doc["payload"])
        rows.append(doc)
    check_rows(rows)
    files = sorted((folder / "checkpoints").glob("*.txt"))
    if files:
        key = vkey or (folder / "node.pub").read_text().strip()
        origin = key.split("+", 1)[0]  # signed-note: the checkpoint's origin is the key's name
        cps = []
        for file in files:
            got_origin, size, root, head = checkpoint_values(file.read_bytes(), key)
            if got_origin != origin:
                raise Bad(0, "checkpoint node")
            if size != int(file.stem):
                raise Bad("-", "manifest checkpoints")
            cps.append((size, root, head))
        against([r["hash"] for r in rows], cps)
    manifest = json.loads((folder / "manifest.json").read_text())
    if type(manifest["events"]) is int and manifest["events"] > len(rows):
        raise Bad(len(rows), "truncated")
    claims(folder, manifest, rows, sorted(int(f.stem) for f in files))
    return len(rows), rows[-1]["hash"]


def claims(folder: Path, manifest: dict, rows: list[dict], sizes: list[int]) -> None:
    """Section 13's claims of the manifest against the contents ("bad - manifest <field>")."""
    shown = {
        "format": "infervisor-bundle/1",
        "node": rows[0]["node"],
        "events": len(rows),
        "head_seq": rows[-1]["seq"],
        "head_hash": rows[-1]["hash"].hex(),
        "checkpoints": sizes,
        "key": "node.pub" if (folder / "node.pub").is_file() else None,
    }
    for field, value in shown.items():
        if manifest.get(field) != value or type(manifest.get(field)) is not type(value):
            raise Bad("-", f"manifest {field}")
    held = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    if set(manifest) != {*shown, "files"} or held - {"manifest.json"} != set(manifest["files"]):
        raise Bad("-", "manifest files")
    for rel, want in manifest["files"].items():
        data = (folder / rel).read_bytes()
        if want != {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}:
            raise Bad("-", "manifest files")


def database(db: Path, checkpoint: Path, vkey: str) -> tuple[int, bytes]:
    conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
    hashes = [bytes(h) for (h,) in conn.execute("SELECT hash FROM events ORDER BY seq")]
    conn.close()
    _, size, root, head = checkpoint_values(checkpoint.read_bytes(), vkey)
    against(hashes, [(size, root, head)])
    return len(hashes), hashes[-1]


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--db"]:
            key = argv[3]
            if Path(key).is_file():
                key = Path(key).read_text().strip()
            count, head = database(Path(argv[1]), Path(argv[2]), key)
        else:
            key = argv[1] if len(argv) > 1 else None
            if key is not None and Path(key).is_file():
                key = Path(key).read_text().strip()
            count, head = bundle(Path(argv[0]), key)
    except Bad as e:
        print(f"bad {e.seq} {e.reason}")
        return 1
    except independent_note.NoteInvalid as e:
        print(f"bad 0 checkpoint signature ({e})")
        return 1
    except (OSError, ValueError, KeyError, IndexError, sqlite3.Error) as e:
        print(f"cannot read: {e}", file=sys.stderr)
        return 2
    print(f"ok {count} {head.hex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
