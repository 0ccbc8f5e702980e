"""A verifier of C2SP signed notes (Ed25519), written from c2sp.org/signed-note alone.

Imports no infervisor code; uses `cryptography` for Ed25519 (RFC 8032).

Verifier keys are read in the `<name>+<hex key ID>+<base64(0x01 || public key)>`
form of golang.org/x/mod/sumdb/note.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class NoteInvalid(Exception):
    pass


def key_id(name: str, public_key: bytes) -> bytes:
    """key ID = SHA-256(key name || 0x0A || 0x01 || 32-byte Ed25519 public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\x0a" + b"\x01" + public_key).digest()[:4]


def parse_vkey(vkey: str) -> tuple[str, bytes, bytes]:
    """(name, key ID, public key) of a verifier key string."""
    name, hex_id, b64 = vkey.strip().split("+", 2)
    raw = base64.b64decode(b64, validate=True)
    if raw[:1] != b"\x01" or len(raw) != 33:
        raise NoteInvalid("not an Ed25519 key")
    if key_id(name, raw[1:]) != bytes.fromhex(hex_id):
        raise NoteInvalid("key ID does not match")
    return name, bytes.fromhex(hex_id), raw[1:]


def verify_note(note: bytes, vkey: str) -> str:
    """Return the note text if the known key signed it; raise NoteInvalid otherwise."""
    name, kid, public = parse_vkey(vkey)
    try:
        text_all = note.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NoteInvalid("not UTF-8") from e
    if any(ord(c) < 0x20 and c != "\n" for c in text_all):
        raise NoteInvalid("control character")
    split = text_all.rfind("\n\n")
    if split < 0 or not text_all.endswith("\n"):
        raise NoteInvalid("no blank line before the signatures")
    text = text_all[: split + 1]  # includes the final newline, not the blank line
    lines = text_all[split + 2 :].split("\n")[:-1]
    if not lines:
        raise NoteInvalid("no signatures")
    verified = False
    for line in lines:
        if not line.startswith("\u2014 "):
            raise NoteInvalid("bad signature line")
        sig_name, b64 = line[2:].split(" ")
        raw = base64.b64decode(b64, validate=True)
        if sig_name != name or raw[:4] != kid:
            continue  # unknown key: ignored
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(raw[4:], text.encode("utf-8"))
        except InvalidSignature as e:
            raise NoteInvalid("signature of the known key fails") from e
        verified = True
    if not verified:
        raise NoteInvalid("no signature by the known key")
    return text
