"""Witness cosignatures of checkpoints (c2sp.org/tlog-cosignature, cosignature/v1).

A cosignature is a signed-note signature line added to a checkpoint by a
witness that checked the checkpoint is a consistent extension of the last one
it cosigned for the same origin::

    — <witness name> base64(key ID || timestamp || Ed25519 signature)

- key ID: ``SHA-256(<name> || "\\n" || 0x04 || 32-byte public key)[:4]``;
- timestamp: 8 bytes, big-endian POSIX seconds (at most 2^63 - 1);
- the signature covers ``"cosignature/v1\\n" + "time <timestamp>\\n"`` followed
  by the checkpoint's whole note body (final newline included, no signature
  lines).

A witness's verifier key (vkey) is ``<name>+<hex key ID>+<base64(0x04 ||
public key)>``; its private key ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x04
|| seed)>``, the form Go's sumdb/note and the witness ecosystem use.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from infervisor.chain import ed25519
from infervisor.chain.errors import NoteError
from infervisor.chain.note import DASH, check_key_name, parse_signature_line, split_key, split_note

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

COSIGNATURE_V1 = 0x04
"""The key type byte of an Ed25519 cosignature/v1 key (c2sp.org/tlog-cosignature)."""

MAX_TIMESTAMP = 2**63 - 1
"""The largest timestamp a cosignature may carry."""

_HEADER = "cosignature/v1\n"
_PRIVATE_PREFIX = "PRIVATE+KEY+"


class CosignatureError(NoteError):
    """A cosignature line is malformed or does not verify under the witness's key."""


def witness_key_id(name: str, public: bytes) -> bytes:
    """Return the 4-byte key ID: SHA-256(name || 0x0A || 0x04 || public)[:4]."""
    import hashlib  # noqa: PLC0415 - OpenSSL, only when a key is named (start-up)

    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([COSIGNATURE_V1]) + public).digest()[
        :4
    ]


def signed_message(body: str, timestamp_s: int) -> bytes:
    """Return the bytes a cosignature signs: header line, time line, checkpoint body.

    Raises:
        CosignatureError: the timestamp is negative or above 2^63 - 1, or the
            body does not end with a newline.
    """
    if not 0 <= timestamp_s <= MAX_TIMESTAMP:
        raise CosignatureError(f"cosignature timestamp {timestamp_s} is outside 0 .. 2^63-1")
    if not body.endswith("\n"):
        raise CosignatureError("the cosigned checkpoint body must end with a newline")
    return f"{_HEADER}time {timestamp_s}\n{body}".encode()


class Cosignature(NamedTuple):
    """A cosignature that verified.

    Attributes:
        witness: the witness's key name.
        key_id: its 4-byte key ID.
        timestamp_s: when the witness cosigned (POSIX seconds, its clock).
        line: the signature line as it appears in a note, without the newline.
    """

    witness: str
    key_id: bytes
    timestamp_s: int
    line: str


class WitnessKey(NamedTuple):
    """A witness's cosignature/v1 verifier key.

    Attributes:
        name: the witness's key name (C2SP recommends a schema-less URL).
        public: the 32-byte Ed25519 public key.
    """

    name: str
    public: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key ID."""
        return witness_key_id(self.name, self.public)

    def key_string(self) -> str:
        """Return the vkey ``<name>+<hex key ID>+<base64(0x04 || public)>``."""
        encoded = base64.b64encode(bytes([COSIGNATURE_V1]) + self.public).decode("ascii")
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    def verify(self, body: str, line: str) -> Cosignature:
        """Check that `line` is this witness's cosignature of the checkpoint `body`.

        Raises:
            CosignatureError: the line is malformed, names another key, or its
                signature does not verify.
        """
        try:
            sig = parse_signature_line(line.rstrip("\n"))
        except NoteError as e:
            raise CosignatureError(str(e)) from e
        if (sig.name, sig.key_id) != (self.name, self.key_id):
            raise CosignatureError(
                f"cosignature by {sig.name}+{sig.key_id.hex()} is not of witness "
                f"{self.name}+{self.key_id.hex()}"
            )
        if len(sig.signature) != 8 + 64:
            raise CosignatureError(
                f"cosignature of {self.name} is {len(sig.signature)} bytes, not 8 + 64"
            )
        (timestamp_s,) = struct.unpack(">Q", sig.signature[:8])
        message = signed_message(body, timestamp_s)
        if not ed25519.verify(self.public, sig.signature[8:], message):
            raise CosignatureError(
                f"the cosignature of {self.name} does not verify: the checkpoint was "
                "altered or cosigned by another key"
            )
        return Cosignature(self.name, self.key_id, timestamp_s, line.rstrip("\n"))


def parse_witness_key(text: str) -> WitnessKey:
    """Parse a witness vkey ``<name>+<hex key ID>+<base64(0x04 || public key)>``.

    Raises:
        NoteError: malformed, not a cosignature/v1 key (type 0x04), or the key
            ID is not that of the name and key.
    """
    try:
        name, kid, public = split_key(text, "witness key", COSIGNATURE_V1)
    except NoteError as e:
        if _is_note_key(text):
            raise NoteError(
                "witness key: this is a signed-note Ed25519 key (type 0x01, such as a "
                "node's node.pub), not a witness's cosignature/v1 key (type 0x04: the "
                "key `infervisor witness vkey CONFIG` prints)"
            ) from e
        raise
    key = WitnessKey(name, public)
    if key.key_id != kid:
        raise NoteError(
            f"witness key: key id {kid.hex()} is not that of {name!r} and this key "
            f"({key.key_id.hex()})"
        )
    return key


def _is_note_key(text: str) -> bool:
    """Whether ``text`` is a well-formed Ed25519 signed-note verifier key."""
    try:
        split_key(text, "key")
    except NoteError:
        return False
    return True


class Cosigner:
    """A witness's private key: makes cosignature/v1 lines.

    Attributes:
        name: the key name.
        key: the matching `WitnessKey`.
    """

    def __init__(self, name: str, private: Ed25519PrivateKey) -> None:
        """Wrap `private` under `name`; see `generate` and `parse_cosigner_key`."""
        self.name = check_key_name(name)
        self._private = private
        public = ed25519.public_of(private)
        self.key = WitnessKey(name, public)

    @classmethod
    def generate(cls, name: str) -> Cosigner:
        """Return a new random cosigner key named `name` (NoteError for a bad name)."""
        return cls(name, ed25519.generate())

    def cosign(self, body: str, timestamp_s: int) -> Cosignature:
        """Cosign the checkpoint `body` (its note text, final newline included) at `timestamp_s`.

        Raises:
            CosignatureError: a timestamp outside 0 .. 2^63-1, or a body without
                its final newline.
        """
        message = signed_message(body, timestamp_s)
        raw = self.key.key_id + struct.pack(">Q", timestamp_s) + self._private.sign(message)
        line = f"{DASH} {self.name} {base64.b64encode(raw).decode('ascii')}"
        return Cosignature(self.name, self.key.key_id, timestamp_s, line)

    def key_string(self) -> str:
        """Return ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x04 || seed)>`` (keep it secret)."""
        seed = ed25519.seed_of(self._private)
        encoded = base64.b64encode(bytes([COSIGNATURE_V1]) + seed).decode("ascii")
        return f"{_PRIVATE_PREFIX}{self.name}+{self.key.key_id.hex()}+{encoded}"


def parse_cosigner_key(text: str) -> Cosigner:
    """Parse ``PRIVATE+KEY+<name>+<hex key ID>+<base64(0x04 || seed)>``.

    Raises:
        NoteError: malformed, not a cosignature/v1 key, or the key ID does not match.
    """
    text = text.strip()
    if not text.startswith(_PRIVATE_PREFIX):
        raise NoteError("cosigner key must start with PRIVATE+KEY+")
    name, kid, seed = split_key(text[len(_PRIVATE_PREFIX) :], "cosigner key", COSIGNATURE_V1)
    cosigner = Cosigner(name, ed25519.private_from_seed(seed))
    if cosigner.key.key_id != kid:
        raise NoteError(f"cosigner key: key id {kid.hex()} does not match the key")
    return cosigner


def cosignatures_of(note: str | bytes, keys: Iterable[WitnessKey]) -> list[Cosignature]:
    """Return the cosignatures in a signed `note` that verify under one of `keys`.

    Lines of other keys (the log's own signature, unknown witnesses) are
    ignored; a line that names a known witness (name and key ID) but does not
    verify is an error, as c2sp.org/signed-note asks of known keys.

    Raises:
        NoteError: the note is malformed.
        CosignatureError: a known witness's line does not verify.
    """
    body, signatures = split_note(note)
    known = {(k.name, k.key_id): k for k in keys}
    found = []
    for sig in signatures:
        key = known.get((sig.name, sig.key_id))
        if key is not None:
            raw = base64.b64encode(sig.key_id + sig.signature).decode("ascii")
            found.append(key.verify(body, f"{DASH} {sig.name} {raw}"))
    return found


def with_cosignatures(note: str, lines: Sequence[str]) -> str:
    """Return the signed `note` with cosignature `lines` appended (duplicates dropped)."""
    have = set(note.splitlines())
    extra = "".join(f"{line}\n" for line in dict.fromkeys(lines) if line not in have)
    return note + extra


class WitnessPolicy(NamedTuple):
    """Which witnesses a reader trusts and how many must have cosigned.

    Attributes:
        keys: the witnesses' keys (distinct names).
        quorum: how many of them must have cosigned (1 .. len(keys)).
    """

    keys: tuple[WitnessKey, ...]
    quorum: int

    @classmethod
    def of(cls, keys: Sequence[WitnessKey], quorum: int | None = None) -> WitnessPolicy:
        """Return a policy of `keys`; `quorum` None means all of them.

        Raises:
            NoteError: two keys share a name, or the quorum is outside 1 .. len(keys).
        """
        names = [k.name for k in keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise NoteError(f"witness {twice[0]!r} is named twice")
        want = len(keys) if quorum is None else quorum
        if keys and not 1 <= want <= len(keys):
            raise NoteError(f"witness quorum must be 1 .. {len(keys)}, found {want}")
        return cls(tuple(keys), want if keys else 0)

    def met_by(self, cosignatures: Iterable[Cosignature]) -> bool:
        """True if distinct witnesses of this policy cosigned at least `quorum` times."""
        mine = {(k.name, k.key_id) for k in self.keys}
        seen = {(c.witness, c.key_id) for c in cosignatures} & mine
        return bool(self.keys) and len(seen) >= self.quorum
