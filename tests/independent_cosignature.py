"""A verifier of Ed25519 cosignature/v1 lines, written from c2sp.org/tlog-cosignature
and c2sp.org/signed-note alone.

Imports no infervisor code; uses `cryptography` for Ed25519 (RFC 8032) and
hashlib for the key ID.

- A witness's verifier key (vkey) is ``<name>+<hex key ID>+<base64(0x04 || public key)>``.
- Key ID: ``SHA-256(<name> || "\\n" || 0x04 || 32-byte public key)[:4]``.
- A cosignature line: ``— <name> base64(key ID || u64 big-endian timestamp || 64-byte sig)``.
- The signed message: ``"cosignature/v1\\n" "time <timestamp decimal>\\n"`` then the
  checkpoint's note body (final newline included, no signature lines).
- Timestamps above 2^63 - 1 are invalid. Lines of other keys are ignored.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

EM_DASH = "\u2014"


class CosignatureInvalid(Exception):
    pass


def cosigner_key_id(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + b"\x04" + public_key).digest()[:4]


def parse_cosigner_vkey(vkey: str) -> tuple[str, bytes, bytes]:
    """(name, key ID, 32-byte public key) of a cosignature/v1 vkey."""
    name, hex_id, b64 = vkey.strip().split("+", 2)
    raw = base64.b64decode(b64, validate=True)
    if len(raw) != 33 or raw[0] != 0x04:
        raise CosignatureInvalid("not an Ed25519 cosignature/v1 key (type 0x04)")
    if cosigner_key_id(name, raw[1:]) != bytes.fromhex(hex_id):
        raise CosignatureInvalid("key ID does not match the name and key")
    return name, bytes.fromhex(hex_id), raw[1:]


def note_body(note: str) -> tuple[str, list[str]]:
    """The body (through its final newline) and the signature lines of a signed note."""
    if not note.endswith("\n"):
        raise CosignatureInvalid("a note ends with a newline")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise CosignatureInvalid("no empty line before the signatures")
    return note[: cut + 1], note[cut + 2 :].split("\n")[:-1]


def verify_cosignature(body: str, line: str, vkey: str) -> int:
    """The timestamp of ``line`` if it is the vkey's valid cosignature of ``body``.

    Raises:
        CosignatureInvalid: another key's line, malformed, or a bad signature.
    """
    name, kid, public = parse_cosigner_vkey(vkey)
    if not line.startswith(EM_DASH + " "):
        raise CosignatureInvalid("a signature line starts with an em dash and a space")
    fields = line[2:].split(" ")
    if len(fields) != 2:
        raise CosignatureInvalid("a signature line is '— <name> <base64>'")
    raw = base64.b64decode(fields[1], validate=True)
    if fields[0] != name or raw[:4] != kid:
        raise CosignatureInvalid("the line is another key's")
    if len(raw) != 4 + 8 + 64:
        raise CosignatureInvalid("an Ed25519 timestamped_signature is 8 + 64 bytes")
    timestamp = int.from_bytes(raw[4:12], "big")
    if timestamp > 2**63 - 1:
        raise CosignatureInvalid("timestamp above 2^63 - 1")
    message = b"cosignature/v1\n" + f"time {timestamp}\n".encode() + body.encode()
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(raw[12:], message)
    except InvalidSignature as e:
        raise CosignatureInvalid("the signature does not verify") from e
    return timestamp


def cosigned_by(note: str, vkey: str) -> int:
    """The timestamp of the vkey's cosignature in a signed ``note``.

    Lines of other keys are ignored; a line naming this key that fails is an error.

    Raises:
        CosignatureInvalid: no line of this key, or one that does not verify.
    """
    name, kid, _ = parse_cosigner_vkey(vkey)
    body, lines = note_body(note)
    for line in lines:
        fields = line[2:].split(" ")
        if len(fields) != 2:
            raise CosignatureInvalid("malformed signature line")
        raw = base64.b64decode(fields[1], validate=True)
        if fields[0] == name and raw[:4] == kid:
            return verify_cosignature(body, line, vkey)
    raise CosignatureInvalid("no cosignature of this witness")
