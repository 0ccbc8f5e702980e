"""The C2SP tlog-witness protocol's add-checkpoint call, as pure functions.

Source: c2sp.org/tlog-witness ("add-checkpoint"), c2sp.org/tlog-checkpoint
(the note text) and RFC 6962 section 2.1.2 (consistency proofs). A log posts
to ``<submission prefix>/add-checkpoint`` a body of::

    old <size the log believes the witness last cosigned>\\n
    <base64 of one consistency proof hash>\\n      (0 .. 63 lines)
    \\n
    <the signed checkpoint note>

The witness answers (`STATUS`): 200 with one or more cosignature lines
(``text/plain``); 409 with its own size as ``<decimal>\\n`` (``text/x.tlog.size``,
`encode_size_body` / `parse_size_body`); 400, 403, 404 or 422 otherwise.

The order of the checks is that of the spec (`judge` does the consistency
part, the signature part is ``chain.note.open_note``):

1. a body that is not as above: 400 (`parse_add_checkpoint`);
2. an origin the witness does not witness: 404;
3. no verifying signature of a trusted key of that origin, or a trusted
   key's signature that fails: 403;
4. old size above the checkpoint size: 400;
5. old size not the size last cosigned for the origin (0 if never): 409;
6. a size-0 checkpoint whose root is not SHA-256 of nothing; a non-empty
   proof from old size 0; a proof that does not verify; old size equal to the
   checkpoint size with another root: 422;
7. otherwise the witness stores the checkpoint, then answers 200.

Errors::

    ChainError
    └── WitnessProtocolError     a body is not as the protocol says (its message names what)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from typing import NamedTuple

from infervisor.chain.errors import ChainError, NoteError, ProofError
from infervisor.chain.merkle import EMPTY_ROOT, HASH_SIZE, verify_consistency
from infervisor.chain.note import DASH, MAX_SIGNATURES, split_note

__all__ = [
    "ADD_CHECKPOINT",
    "MAX_NOTE_BYTES",
    "MAX_PROOF_LINES",
    "MAX_REQUEST_BYTES",
    "SIZE_CONTENT_TYPE",
    "STATUS",
    "AddCheckpoint",
    "Refusal",
    "TlogCheckpoint",
    "WitnessProtocolError",
    "WitnessState",
    "encode_add_checkpoint",
    "encode_size_body",
    "judge",
    "monitoring_path",
    "parse_add_checkpoint",
    "parse_checkpoint_body",
    "parse_cosignature_lines",
    "parse_size_body",
]

ADD_CHECKPOINT = "/add-checkpoint"
"""The add-checkpoint path under a witness's submission prefix."""

SIZE_CONTENT_TYPE = "text/x.tlog.size"
"""The Content-Type of a 409 answer's body (the witness's size and a newline)."""

MAX_PROOF_LINES = 63
"""Consistency proof lines a client may send (c2sp.org/tlog-witness)."""

MAX_NOTE_BYTES = 32 * 1024
"""Bytes a submitted checkpoint note may take (ours: origin, extensions and up to
`chain.note.MAX_SIGNATURES` signature lines fit in a fraction of it)."""

MAX_REQUEST_BYTES = 64 * 1024
"""Bytes a whole add-checkpoint body may take: the old line, 63 proof lines, the note."""

MAX_SIZE = 2**63 - 1
"""The largest tree size accepted (sizes are 64-bit everywhere in the ecosystem)."""

STATUS: dict[int, str] = {
    200: "cosigned: the body is the witness's cosignature line(s) of the checkpoint",
    400: "bad request: the body is not 'old N', proof lines, an empty line and a "
    "checkpoint, or old N is above the checkpoint's size",
    403: "no trusted signature: no signature of a key the witness trusts for the origin "
    "verifies, or a trusted key's signature fails",
    404: "unknown origin: the witness does not witness this log",
    409: "old size mismatch: the body (text/x.tlog.size) is the size the witness last "
    "cosigned; rebuild the proof from it and post again",
    422: "not consistent: the consistency proof does not verify, a proof came with old 0, "
    "equal sizes with different roots, or a size-0 checkpoint with a non-empty root",
}
"""What each add-checkpoint status means (c2sp.org/tlog-witness)."""

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


class WitnessProtocolError(ChainError):
    """A tlog-witness body (request, 409 size, 200 cosignatures) is not as the spec says."""


class TlogCheckpoint(NamedTuple):
    """A c2sp.org/tlog-checkpoint note text, parsed (its signatures not checked).

    Attributes:
        origin: the first line: the log's identity.
        size: the tree size (leaves), >= 0.
        root: the 32-byte RFC 6962 root hash.
        extensions: the extension lines after the root, opaque.
    """

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...]


class AddCheckpoint(NamedTuple):
    """An add-checkpoint request body, parsed.

    Attributes:
        old_size: the size the client believes the witness last cosigned.
        proof: the consistency proof hashes (32 bytes each, at most 63).
        note: the signed checkpoint note (text, blank line, signature lines).
        checkpoint: its note text, parsed.
    """

    old_size: int
    proof: tuple[bytes, ...]
    note: str
    checkpoint: TlogCheckpoint


class WitnessState(NamedTuple):
    """What a witness holds for one origin: the latest checkpoint it cosigned."""

    size: int
    root: bytes


class Refusal(NamedTuple):
    """Why a witness does not cosign: the HTTP status (`STATUS`) and one line."""

    status: int
    reason: str


def _size(text: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text) or int(text) > MAX_SIZE:
        raise WitnessProtocolError(
            f"{what} must be a decimal 0 .. 2^63-1 without leading zeros, found {text[:40]!r}"
        )
    return int(text)


def _hash(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as e:
        raise WitnessProtocolError(f"{what} is not base64: {text[:60]!r}") from e
    if len(raw) != HASH_SIZE or base64.b64encode(raw).decode("ascii") != text:
        raise WitnessProtocolError(
            f"{what} must be a 32-byte hash in standard base64, found {text[:60]!r}"
        )
    return raw


def parse_checkpoint_body(text: str) -> TlogCheckpoint:
    """Parse a checkpoint's note text (c2sp.org/tlog-checkpoint, "Note text").

    At least three non-empty lines, each ending in a newline: origin, tree size
    (decimal, no leading zeros), base64 root hash; then optional non-empty
    extension lines.

    Raises:
        WitnessProtocolError: naming the line that is not as specified.
    """
    if not text.endswith("\n"):
        raise WitnessProtocolError("checkpoint text must end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise WitnessProtocolError(
            f"checkpoint text must have at least 3 lines (origin, size, root), found {len(lines)}"
        )
    if any(not line for line in lines):
        raise WitnessProtocolError("checkpoint text must not have an empty line")
    origin, size, root, *extensions = lines
    return TlogCheckpoint(
        origin, _size(size, "checkpoint size"), _hash(root, "checkpoint root"), tuple(extensions)
    )


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """Parse an add-checkpoint request body (c2sp.org/tlog-witness, "add-checkpoint").

    Checks the shape only: the checkpoint's signatures are the witness's to
    verify (``chain.note.open_note``), the proof `judge`'s.

    Raises:
        WitnessProtocolError: one line naming what is wrong: the body is over
            `MAX_REQUEST_BYTES`, not UTF-8, the old line, a proof line, more
            than `MAX_PROOF_LINES`, no empty line, a note over
            `MAX_NOTE_BYTES` or not a note, a checkpoint text not as specified.
    """
    if len(body) > MAX_REQUEST_BYTES:
        raise WitnessProtocolError(
            f"request body is {len(body)} bytes; at most {MAX_REQUEST_BYTES}"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WitnessProtocolError(f"request body is not UTF-8: {e.reason}") from e
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise WitnessProtocolError(
            "request body must be 'old N', proof lines, an empty line, then the checkpoint"
        )
    first, *proof_lines = head.split("\n")
    if not first.startswith("old "):
        raise WitnessProtocolError(f"first line must be 'old <size>', found {first[:40]!r}")
    old = _size(first[4:], "old size")
    if len(proof_lines) > MAX_PROOF_LINES:
        raise WitnessProtocolError(
            f"{len(proof_lines)} consistency proof lines; at most {MAX_PROOF_LINES}"
        )
    proof = tuple(_hash(line, f"proof line {i + 1}") for i, line in enumerate(proof_lines))
    return AddCheckpoint(old, proof, note, _parse_note(note))


def _parse_note(note: str) -> TlogCheckpoint:
    if len(note.encode("utf-8")) > MAX_NOTE_BYTES:
        raise WitnessProtocolError(f"checkpoint note is over {MAX_NOTE_BYTES} bytes")
    try:
        text, _ = split_note(note)
    except NoteError as e:
        raise WitnessProtocolError(f"checkpoint is not a signed note: {e}") from e
    return parse_checkpoint_body(text)


def encode_add_checkpoint(old_size: int, proof: Sequence[bytes], note: str) -> bytes:
    """Return the add-checkpoint request body for `note` with `proof` from `old_size`.

    Raises:
        WitnessProtocolError: a negative size, more than 63 hashes, a hash not
            32 bytes, or a note not ending in a newline.
    """
    if not 0 <= old_size <= MAX_SIZE:
        raise WitnessProtocolError(f"old size {old_size} is outside 0 .. 2^63-1")
    if len(proof) > MAX_PROOF_LINES:
        raise WitnessProtocolError(f"{len(proof)} proof hashes; at most {MAX_PROOF_LINES}")
    if any(len(h) != HASH_SIZE for h in proof):
        raise WitnessProtocolError("every consistency proof hash must be 32 bytes")
    if not note.endswith("\n"):
        raise WitnessProtocolError("the checkpoint note must end with a newline")
    lines = "".join(base64.b64encode(h).decode("ascii") + "\n" for h in proof)
    return f"old {old_size}\n{lines}\n{note}".encode()


def encode_size_body(size: int) -> bytes:
    """Return a 409 body: the witness's size in decimal and a newline (text/x.tlog.size)."""
    return f"{size}\n".encode("ascii")


def parse_size_body(body: bytes) -> int:
    """Return the size in a 409 ``text/x.tlog.size`` body.

    Raises:
        WitnessProtocolError: not one decimal line.
    """
    text = body.decode("ascii", errors="replace")
    if not text.endswith("\n"):
        raise WitnessProtocolError(f"a text/x.tlog.size body is '<size>\\n', found {text[:40]!r}")
    return _size(text[:-1], "the witness's size")


def parse_cosignature_lines(body: bytes) -> list[str]:
    """Return the signature lines of a 200 answer (each without its newline).

    Raises:
        WitnessProtocolError: not UTF-8, empty, a line not starting with the em
            dash and a space, or not ending with a newline.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WitnessProtocolError(f"cosignature answer is not UTF-8: {e.reason}") from e
    if not text.endswith("\n"):
        raise WitnessProtocolError("cosignature answer must be signature lines ending in newlines")
    lines = text[:-1].split("\n")
    bad = next((line for line in lines if not line.startswith(DASH + " ")), None)
    if bad is not None:
        raise WitnessProtocolError(f"cosignature answer has a non-signature line {bad[:60]!r}")
    if len(lines) > MAX_SIGNATURES:
        raise WitnessProtocolError(f"{len(lines)} cosignature lines; at most {MAX_SIGNATURES}")
    return lines


def judge(request: AddCheckpoint, state: WitnessState | None) -> Refusal | None:
    """Decide the consistency part of add-checkpoint (steps 4 to 6 of the module doc).

    Args:
        request: the parsed request; its checkpoint's signature already verified.
        state: what the witness holds for the checkpoint's origin (None: never cosigned).

    Returns:
        None if the witness must cosign (and store the checkpoint first), else
        the `Refusal` (400, 409 with the witness's size as reason, or 422).
    """
    cp, old, proof = request.checkpoint, request.old_size, request.proof
    held = state if state is not None else WitnessState(0, EMPTY_ROOT)
    if old > cp.size:
        return Refusal(400, f"old size {old} is above the checkpoint's size {cp.size}")
    if old != held.size:
        return Refusal(409, str(held.size))
    if cp.size == 0 and cp.root != EMPTY_ROOT:
        return Refusal(422, "a checkpoint of size 0 must have the empty tree's root")
    if old == 0:
        if proof:
            return Refusal(422, f"old size 0 takes no consistency proof, found {len(proof)} lines")
        return None
    if old == cp.size:
        if proof:
            return Refusal(422, "a consistency proof between equal sizes must be empty")
        if cp.root != held.root:
            return Refusal(422, f"two different roots for tree size {old}: the log forked")
        return None
    try:
        verify_consistency(old, cp.size, held.root, cp.root, proof)
    except ProofError as e:
        return Refusal(422, f"consistency proof from {old} to {cp.size} fails: {e}")
    return None


def monitoring_path(origin: str) -> str:
    """Return ``/<hex SHA-256 of origin>/checkpoint``: the spec's monitoring path."""
    return f"/{hashlib.sha256(origin.encode('utf-8')).hexdigest()}/checkpoint"
