"""An independent verifier of a node's tlog-tiles log, written from
c2sp.org/tlog-tiles, RFC 6962 / RFC 9162 and docs/chain-format.md alone.

It shares no code with infervisor (hashlib, blake3, json, urllib; the
checkpoint's signature with tests/independent_note.py, itself independent):
it fetches the checkpoint, rebuilds the root from the hash tiles, checks
that chosen events are in the tree (their event hash recomputed from the
entry bundle's export line, their leaf found in the level-0 tile, the node's
inclusion proof verified) and verifies the node's consistency proofs from
older sizes, whose roots it also rebuilds from the tiles.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import urllib.request

import blake3
from independent_note import verify_note

EVENT_CONTEXT = "infervisor 2026-11 chain event v1"
PAYLOAD_CONTEXT = "infervisor 2026-11 chain payload v1"


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def node(left: bytes, right: bytes) -> bytes:
    return sha(b"\x01" + left + right)


def mth(hashes: list[bytes]) -> bytes:
    """RFC 6962 MTH over already-hashed leaves (len >= 1)."""
    if len(hashes) == 1:
        return hashes[0]
    k = 1 << ((len(hashes) - 1).bit_length() - 1)
    return node(mth(hashes[:k]), mth(hashes[k:]))


def index_path(n: int) -> str:
    digits = f"{n:d}"
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join(["x" + g for g in groups[:-1]] + [groups[-1]])


class Client:
    def __init__(self, prefix: str, token: str) -> None:
        self.prefix, self.token = prefix.rstrip("/"), token

    def get(self, path: str) -> bytes:
        request = urllib.request.Request(
            f"{self.prefix}/{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            return bytes(answer.read())

    def tile(self, level: int, index: int, size: int) -> list[bytes]:
        """The hashes of tile (level, index) as the tree of `size` leaves has it."""
        width = min(256, size // 256**level - index * 256)
        suffix = "" if width == 256 else f".p/{width}"
        data = self.get(f"tile/{level}/{index_path(index)}{suffix}")
        assert len(data) == 32 * width, (level, index, width, len(data))
        return [data[i : i + 32] for i in range(0, len(data), 32)]

    def entries(self, index: int, size: int) -> list[bytes]:
        width = min(256, size - index * 256)
        suffix = "" if width == 256 else f".p/{width}"
        data, out, at = self.get(f"tile/entries/{index_path(index)}{suffix}"), [], 0
        while at < len(data):
            (length,) = struct.unpack(">H", data[at : at + 2])
            out.append(data[at + 2 : at + 2 + length])
            at += 2 + length
        assert len(out) == width
        return out


def root_from_tiles(client: Client, size: int) -> bytes:
    """The tree's root from its tiles: each perfect subtree of the compact range is
    at most 128 aligned hashes of one tile at level k // 8."""
    stack, at, rest = [], 0, size
    while rest:
        k = rest.bit_length() - 1
        level = k // 8
        first = at // 256**level
        hashes = client.tile(level, first // 256, size)
        lo = first % 256
        stack.append(mth(hashes[lo : lo + (1 << (k - 8 * level))]))
        at, rest = at + (1 << k), rest - (1 << k)
    digest = stack[-1]
    for left in reversed(stack[:-1]):
        digest = node(left, digest)
    return digest


def event_hash_of(entry: bytes) -> tuple[int, bytes]:
    """(seq, event hash) recomputed from an export line (docs/chain-format.md, "Hashing")."""
    doc = json.loads(entry)
    payload = base64.b64decode(doc["payload"], validate=True)
    payload_hash = blake3.blake3(payload, derive_key_context=PAYLOAD_CONTEXT).digest()
    assert payload_hash.hex() == doc["payload_hash"], "payload hash"
    header = struct.pack(">Qq", doc["seq"], doc["ts_ns"])
    for name in ("node", "source", "kind", "subject"):
        text = doc[name].encode("utf-8")
        header += struct.pack(">I", len(text)) + text
    header += payload_hash + bytes.fromhex(doc["prev_hash"])
    digest = blake3.blake3(header, derive_key_context=EVENT_CONTEXT).digest()
    assert digest.hex() == doc["hash"], "event hash"
    return doc["seq"], digest


def verify_inclusion(index: int, size: int, leaf: bytes, proof: list[bytes], root: bytes) -> None:
    """RFC 9162 section 2.1.3.2."""
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        assert sn != 0, "proof too long"
        if fn & 1 or fn == sn:
            r = node(p, r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node(r, p)
        fn, sn = fn >> 1, sn >> 1
    assert sn == 0 and r == root, "inclusion"


def verify_consistency(m: int, n: int, old: bytes, new: bytes, proof: list[bytes]) -> None:
    """RFC 9162 section 2.1.4.2."""
    if m == n:
        assert not proof and old == new
        return
    if m & (m - 1) == 0:
        proof = [old, *proof]
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        assert sn != 0, "proof too long"
        if fn & 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    assert sn == 0 and fr == old and sr == new, "consistency"


def verify_log(prefix: str, token: str, vkey: str, seqs: list[int]) -> dict[str, object]:
    """Verify the log at `prefix`; raise AssertionError (or a note error) on a problem."""
    client = Client(prefix, token)
    text = verify_note(client.get("checkpoint"), vkey)
    lines = text.split("\n")
    size, root = int(lines[1]), base64.b64decode(lines[2])
    assert root_from_tiles(client, size) == root, "tiles do not make the signed root"
    for seq in seqs:
        entry = client.entries(seq // 256, size)[seq % 256]
        found, digest = event_hash_of(entry)
        assert found == seq
        leaf = sha(b"\x00" + digest)
        assert client.tile(0, seq // 256, size)[seq % 256] == leaf, "leaf not in its tile"
        doc = json.loads(client.get(f"proof/inclusion?seq={seq}&size={size}"))
        verify_inclusion(seq, size, leaf, [bytes.fromhex(h) for h in doc["proof"]], root)
    olds = sorted({1, min(256, size), size - 1} - {0})
    for old in olds:
        doc = json.loads(client.get(f"proof/consistency?old={old}&new={size}"))
        old_root = root_from_tiles(client, old)
        verify_consistency(old, size, old_root, root, [bytes.fromhex(h) for h in doc["proof"]])
    return {"size": size, "root": root.hex(), "included": len(seqs), "consistent_from": olds}
