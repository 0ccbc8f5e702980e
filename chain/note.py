"""C2SP signed notes with Ed25519 keys (c2sp.org/signed-note).

A signed note is a text ending in a newline, a blank line, then one or more
signature lines ``"\\u2014 " + key name + " " + base64(key ID || signature) + "\\n"``.
The key ID is ``SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4]``
(big-endian uint32); the Ed25519 signature (RFC 8032) covers the note text,
final newline included. Base64 is standard RFC 4648 section 4 (with padding).

Key strings are those of Go's golang.org/x/mod/sumdb/note, which the C2SP
tooling reads:

- verifier key: ``<name>+<8 lowercase hex digits of the key ID>+<base64(0x01 || public key)>``
- signer key: ``PRIVATE+KEY+<name>+<key ID hex>+<base64(0x01 || 32-byte private seed)>``
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from infervisor.chain import ed25519
from infervisor.chain.errors import NoteError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ED25519 = 0x01
"""The signature type byte of Ed25519 (C2SP signed-note, "Signature types")."""

DASH = "\u2014"
"""The em dash that starts a signature line."""

MAX_SIGNATURES = 100
"""Signature lines accepted in one note (the spec asks for at least 16)."""

_PRIVATE_PREFIX = "PRIVATE+KEY+"


def check_key_name(name: str) -> str:
    """Return `name` if it can name a key: non-empty, no Unicode space, no "+".

    Raises:
        NoteError: naming what is wrong.
    """
    if not name or any(ch.isspace() or ch == "+" for ch in name):
        raise NoteError(f"key name {name!r} must be non-empty, without spaces or '+'")
    if any(ord(ch) < 0x20 for ch in name):
        raise NoteError(f"key name {name!r} must not contain control characters")
    return name


def key_id(name: str, public: bytes) -> bytes:
    """Return the 4-byte key ID of an Ed25519 key: SHA-256(name || 0x0A || 0x01 || public)[:4]."""
    import hashlib  # noqa: PLC0415 - OpenSSL, only when a key is named (start-up)

    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519]) + public).digest()[:4]


class Verifier(NamedTuple):
    """A named Ed25519 public key that checks note signatures.

    Attributes:
        name: the key name (C2SP recommends a schema-less URL).
        public: the 32-byte public key (RFC 8032 encoding).
    """

    name: str
    public: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key ID."""
        return key_id(self.name, self.public)

    def key_string(self) -> str:
        """Return ``<name>+<hex key ID>+<base64(0x01 || public)>``."""
        encoded = base64.b64encode(bytes([ED25519]) + self.public).decode("ascii")
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    def verify(self, text: bytes, signature: bytes) -> bool:
        """Return True if `signature` (64 bytes) is this key's Ed25519 signature of `text`."""
        return ed25519.verify(self.public, signature, text)


class Signer:
    """A named Ed25519 private key that signs notes.

    Attributes:
        name: the key name.
        verifier: the matching `Verifier`.
    """

    def __init__(self, name: str, private: Ed25519PrivateKey) -> None:
        """Wrap `private` under `name`; see `generate` and `parse_signer_key`."""
        self.name = check_key_name(name)
        self._private = private
        self.verifier = Verifier(name, ed25519.public_of(private))

    @classmethod
    def generate(cls, name: str) -> Signer:
        """Return a new random key named `name` (raises NoteError for a bad name)."""
        return cls(name, ed25519.generate())

    def sign(self, text: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of `text` (RFC 8032)."""
        return self._private.sign(text)

    def key_string(self) -> str:
        """Return ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x01 || seed)>`` (keep it secret)."""
        seed = ed25519.seed_of(self._private)
        encoded = base64.b64encode(bytes([ED25519]) + seed).decode("ascii")
        return f"{_PRIVATE_PREFIX}{self.name}+{self.verifier.key_id.hex()}+{encoded}"


def key_text(key: str | os.PathLike[str]) -> str:
    """The key string ``key`` names: the text of the file it names (surrounding
    whitespace stripped), else ``key`` itself. The one reading of a "key string
    or a file holding one" (``--key``, ``--witness``; a newcomer's trial, stop 33:
    ``--witness pub1.txt`` was parsed as a key string).

    Lines starting with ``#`` and blank lines of a file are skipped (a comment
    beside the key); the one line left is the key.

    Raises:
        NoteError: the file cannot be read, is not ASCII, or holds no key or more
            than one (the message does not name the file: the caller names it with
            its option, ``--key FILE: ...``).
    """
    text = os.fspath(key)
    if not os.path.isfile(text):
        return text
    try:
        lines = Path(text).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise NoteError(f"cannot read the key: {e}") from e
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if len(keys) != 1:
        found = "no key" if not keys else f"{len(keys)} keys"
        raise NoteError(f"holds {found}: a key file holds one key string on one line")
    return keys[0]


def split_key(text: str, what: str, kind: int = ED25519) -> tuple[str, bytes, bytes]:
    """Split ``<name>+<hex key ID>+<base64(kind || 32-byte key)>`` (key ID not yet checked).

    The base64 part may itself hold "+": only the first two "+" separate fields
    (a key name may not contain one).

    Raises:
        NoteError: malformed, or the key type byte is not `kind`.
    """
    if text.strip().startswith(_PRIVATE_PREFIX):  # stop 34: read as a malformed key id
        raise NoteError(
            f"{what}: this is a PRIVATE signing key (PRIVATE+KEY+...), not a public key: keep "
            "it where it signs and give its public half, <name>+<hex id>+<base64> (a node's "
            "node.pub; a witness's `infervisor witness vkey CONFIG`)"
        )
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError(
            f"{what} must be <name>+<key id hex>+<base64 key>, found {len(parts)} parts"
        )
    name, hex_id, b64 = parts
    check_key_name(name)
    try:
        kid = bytes.fromhex(hex_id)
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error) as e:
        raise NoteError(f"{what}: bad key id or base64 key: {e}") from e
    if len(hex_id) != 8 or hex_id != hex_id.lower():
        raise NoteError(f"{what}: key id must be 8 lowercase hex digits, found {hex_id!r}")
    if len(raw) != 33 or raw[0] != kind:
        raise NoteError(
            f"{what}: key must be type 0x{kind:02x} and 32 bytes, found type "
            f"0x{raw[:1].hex() or '--'} and {max(len(raw) - 1, 0)} bytes"
        )
    return name, kid, raw[1:]


def parse_verifier_key(text: str) -> Verifier:
    """Parse ``<name>+<hex key ID>+<base64(0x01 || public key)>``.

    Raises:
        NoteError: malformed, not Ed25519, or the key ID does not match name and key.
    """
    name, kid, public = split_key(text, "verifier key")
    verifier = Verifier(name, public)
    if verifier.key_id != kid:
        raise NoteError(
            f"verifier key: key id {kid.hex()} is not that of {name!r} and this key "
            f"({verifier.key_id.hex()})"
        )
    return verifier


def parse_signer_key(text: str) -> Signer:
    """Parse ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x01 || seed)>``.

    Raises:
        NoteError: malformed, not Ed25519, or the key ID does not match.
    """
    text = text.strip()
    if not text.startswith(_PRIVATE_PREFIX):
        raise NoteError("signer key must start with PRIVATE+KEY+")
    name, kid, seed = split_key(text[len(_PRIVATE_PREFIX) :], "signer key")
    signer = Signer(name, ed25519.private_from_seed(seed))
    if signer.verifier.key_id != kid:
        raise NoteError(f"signer key: key id {kid.hex()} does not match the key")
    return signer


class Signature(NamedTuple):
    """One signature line: key name, 4-byte key ID, signature bytes."""

    name: str
    key_id: bytes
    signature: bytes


def sign_note(text: str, *signers: Signer) -> str:
    """Return the signed note of `text`: the text, a blank line, one line per signer.

    Args:
        text: the note text; must end with a newline, be UTF-8 and contain no
            control characters but newlines.

    Raises:
        NoteError: the text cannot be a note text.
    """
    _check_text(text)
    data = text.encode("utf-8")
    lines = []
    for signer in signers:
        sig = base64.b64encode(signer.verifier.key_id + signer.sign(data)).decode("ascii")
        lines.append(f"{DASH} {signer.name} {sig}\n")
    return text + "\n" + "".join(lines)


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("note text must end with a newline")
    bad = next((ch for ch in text if ord(ch) < 0x20 and ch != "\n"), None)
    if bad is not None:
        raise NoteError(f"note text must not contain control character {bad!r}")


def split_note(note: str | bytes) -> tuple[str, list[Signature]]:
    """Split a signed note into its text and signature lines (nothing verified).

    Raises:
        NoteError: not valid UTF-8, a control character, no blank line before
            the signatures, or a malformed signature line.
    """
    if isinstance(note, bytes):
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NoteError(f"signed note is not valid UTF-8: {e}") from e
    if any(ord(ch) < 0x20 and ch != "\n" for ch in note):
        raise NoteError("signed note contains an ASCII control character other than newline")
    if not note.endswith("\n"):
        raise NoteError("signed note must end with a newline")
    cut = note.rfind("\n\n")
    if cut < 0:
        raise NoteError("signed note has no blank line between its text and its signatures")
    text, block = note[: cut + 1], note[cut + 2 :]
    signatures = []
    for line in block.splitlines():
        signatures.append(parse_signature_line(line))
    if not signatures:
        raise NoteError("signed note has no signature lines")
    if len(signatures) > MAX_SIGNATURES:
        raise NoteError(f"signed note has {len(signatures)} signatures; at most {MAX_SIGNATURES}")
    return text, signatures


def parse_signature_line(line: str) -> Signature:
    """Parse one ``— <name> <base64(key ID || signature)>`` line (nothing verified).

    Raises:
        NoteError: not a signature line.
    """
    prefix = DASH + " "
    if not line.startswith(prefix):
        raise NoteError(f"signature line must start with an em dash and a space: {line[:40]!r}")
    parts = line[len(prefix) :].split(" ")
    if len(parts) != 2 or not parts[0]:
        raise NoteError(f"signature line must be '— <name> <base64>': {line[:60]!r}")
    name, b64 = parts
    try:
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error) as e:
        raise NoteError(f"signature of {name!r} is not base64: {e}") from e
    if len(raw) < 5:
        raise NoteError(f"signature of {name!r} is too short ({len(raw)} bytes)")
    return Signature(name, raw[:4], raw[4:])


def open_note(note: str | bytes, verifiers: list[Verifier]) -> str:
    """Return the text of a signed note once a known key's signature verifies.

    Signatures of unknown keys (name and key ID not both those of a verifier)
    are ignored; a known key's signature that fails rejects the whole note.

    Raises:
        NoteError: malformed, a known key's signature fails, or no known key signed.
    """
    text, signatures = split_note(note)
    data = text.encode("utf-8")
    known = {(v.name, v.key_id): v for v in verifiers}
    good = 0
    for sig in signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verify(data, sig.signature):
            raise NoteError(
                f"the signature of {sig.name} (key id {sig.key_id.hex()}) does not verify: "
                "the note was altered or signed by another key"
            )
        good += 1
    if not good:
        names = ", ".join(f"{s.name}+{s.key_id.hex()}" for s in signatures)
        wanted = ", ".join(f"{v.name}+{v.key_id.hex()}" for v in verifiers) or "none"
        raise NoteError(f"no signature of a known key: signed by {names}; known keys: {wanted}")
    return text
