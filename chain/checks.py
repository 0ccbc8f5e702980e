"""Checks of one chain row against the row before it (docs/chain-format.md, "Verification").

Pure functions over rows read with TEXT returned as bytes. What they need to
know about other rows (does seq N exist? does a later row have this hash?)
they ask a `Lookups` object, consulted only once a row is already wrong.
"""

from __future__ import annotations

import json
from typing import Literal, NamedTuple, Protocol

import msgspec

from infervisor.chain.hashing import HASH_SIZE, ZERO_HASH, event_hash, header_bytes, payload_hash
from infervisor.chain.records import FORMAT_VERSION, GENESIS_KIND, GENESIS_SOURCE, HASH_NAME

Reason = Literal[
    "payload altered",
    "header altered",
    "link broken",
    "gap",
    "duplicate",
    "reordered",
    "bad genesis",
    "malformed row",
]


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """The first thing wrong with a chain.

    Attributes:
        seq: the seq of the offending row (for a row whose seq is not an
            integer, the seq expected at its position).
        reason: one of the `Reason` values.
        detail: what was expected and what was found, for an operator.
    """

    seq: int
    reason: Reason
    detail: str


class Row(NamedTuple):
    """A well-formed row: integers checked, text fields as their UTF-8 bytes."""

    seq: int
    ts_ns: int
    node: bytes
    source: bytes
    kind: bytes
    subject: bytes
    payload: bytes
    payload_hash: bytes
    prev_hash: bytes
    hash: bytes


class Lookups(Protocol):
    """What a check may ask about the rest of the table."""

    def seq_exists(self, seq: int) -> bool:
        """Return True if some row has this seq."""
        ...

    def later_seq_with_hash(self, digest: bytes, seq: int) -> int | None:
        """Return the seq of a row after `seq` whose hash is `digest`, if any."""
        ...


class _MalformedError(Exception):
    """A column of a row holds something no chain writer produces."""


def parse_row(raw: tuple[object, ...], expected: int) -> Row | Problem:
    """Return `raw` (the 10 columns, TEXT as bytes) as a `Row`, or a "malformed row" problem.

    Args:
        raw: the row, columns in `Row` order.
        expected: the seq expected at this position, reported if seq is unusable.
    """
    at = raw[0] if isinstance(raw[0], int) else expected
    try:
        return Row(
            _integer("seq", raw[0], low=0),
            _integer("ts_ns", raw[1], low=-(2**63)),
            _text("node", raw[2]),
            _text("source", raw[3]),
            _text("kind", raw[4]),
            _text("subject", raw[5]),
            _blob("payload", raw[6], size=None),
            _blob("payload_hash", raw[7], size=HASH_SIZE),
            _blob("prev_hash", raw[8], size=HASH_SIZE),
            _blob("hash", raw[9], size=HASH_SIZE),
        )
    except _MalformedError as exc:
        return Problem(seq=at, reason="malformed row", detail=str(exc))


def _integer(name: str, value: object, *, low: int) -> int:
    if not isinstance(value, int) or value < low:
        raise _MalformedError(f"{name} must be an integer >= {low}, found {value!r}")
    return value


def _text(name: str, value: object) -> bytes:
    value = _blob(name, value, size=None)
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        raise _MalformedError(f"{name} is not valid UTF-8: {value!r}") from None
    return value


def _blob(name: str, value: object, *, size: int | None) -> bytes:
    if not isinstance(value, bytes):
        raise _MalformedError(f"{name} must be text or a blob, found {value!r}")
    if size is not None and len(value) != size:
        raise _MalformedError(f"{name} must be {size} bytes, found {len(value)}: {value.hex()}")
    return value


def check_row(
    row: Row, before: Row | None, genesis: Row | None, lookups: Lookups
) -> Problem | None:
    """Return the first problem of `row`, checked in the documented order, or None.

    Args:
        row: the row being checked.
        before: the previous row (None: `row` is the first row read).
        genesis: the chain's genesis row (None: `row` is the first row read).
        lookups: questions about other rows, asked only for a wrong row.
    """
    return (
        _check_seq(row, before, lookups)
        or _check_payload(row)
        or _check_link(row, before, lookups)
        or _check_header(row)
        or (_check_genesis(row) if genesis is None else _check_member(row, genesis))
    )


def _check_seq(row: Row, before: Row | None, lookups: Lookups) -> Problem | None:
    expected = 0 if before is None else before.seq + 1
    if row.seq < expected:
        again = before is not None and row.seq == before.seq
        return Problem(
            seq=row.seq,
            reason="duplicate" if again else "reordered",
            detail=f"expected seq {expected}, found seq {row.seq}{' again' if again else ''}",
        )
    if row.seq > expected:
        if lookups.seq_exists(expected):
            detail = f"expected seq {expected}, found {row.seq}; seq {expected} is stored elsewhere"
            return Problem(seq=row.seq, reason="reordered", detail=detail)
        detail = f"expected seq {expected}, found {row.seq}: seq {expected}..{row.seq - 1} missing"
        return Problem(seq=row.seq, reason="gap", detail=detail)
    return None


def _check_payload(row: Row) -> Problem | None:
    digest = payload_hash(row.payload)
    if digest == row.payload_hash:
        return None
    detail = f"payload hashes to {digest.hex()}, row records payload_hash {row.payload_hash.hex()}"
    return Problem(seq=row.seq, reason="payload altered", detail=detail)


def _check_link(row: Row, before: Row | None, lookups: Lookups) -> Problem | None:
    wanted = ZERO_HASH if before is None else before.hash
    if row.prev_hash == wanted:
        return None
    found = row.prev_hash.hex()
    later = lookups.later_seq_with_hash(row.prev_hash, row.seq)
    if later is not None:
        detail = f"prev_hash {found} is the hash of seq {later}, a later row: rows were swapped"
        return Problem(seq=row.seq, reason="reordered", detail=detail)
    if before is None:
        detail = f"prev_hash of seq 0 must be 32 zero bytes, found {found}"
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    detail = f"prev_hash {found} is not the hash of seq {before.seq} ({wanted.hex()})"
    return Problem(seq=row.seq, reason="link broken", detail=detail)


def _check_header(row: Row) -> Problem | None:
    header = header_bytes(
        seq=row.seq,
        ts_ns=row.ts_ns,
        fields=(row.node, row.source, row.kind, row.subject),
        payload_digest=row.payload_hash,
        prev_hash=row.prev_hash,
    )
    digest = event_hash(header)
    if digest == row.hash:
        return None
    detail = f"header hashes to {digest.hex()}, row records hash {row.hash.hex()}"
    return Problem(seq=row.seq, reason="header altered", detail=detail)


def _check_genesis(row: Row) -> Problem | None:
    if row.kind != GENESIS_KIND.encode():
        detail = f"seq 0 must be a {GENESIS_KIND!r} event, found kind {row.kind.decode()!r}"
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    if row.source != GENESIS_SOURCE.encode():
        detail = f"seq 0 must have source {GENESIS_SOURCE!r}, found {row.source.decode()!r}"
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    if row.subject != b"":
        detail = f"seq 0 must have the empty subject, found {row.subject.decode()!r}"
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    want = {"format": FORMAT_VERSION, "hash": HASH_NAME, "node": row.node.decode()}
    if genesis_document(row.payload) != want:
        detail = (
            f"genesis payload must be {json.dumps(want, sort_keys=True)}, found {row.payload!r}"
        )
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    return None


def _check_member(row: Row, genesis: Row) -> Problem | None:
    if row.node != genesis.node:
        detail = f"node {row.node.decode()!r} is not the chain's node {genesis.node.decode()!r}"
        return Problem(seq=row.seq, reason="header altered", detail=detail)
    if row.kind == GENESIS_KIND.encode():
        detail = f"kind {GENESIS_KIND!r} is allowed at seq 0 only"
        return Problem(seq=row.seq, reason="bad genesis", detail=detail)
    return None


def genesis_document(payload: bytes) -> dict[str, object] | None:
    """Return a genesis payload as a dict whose "format" is an int, or None if it is not one."""
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or type(doc.get("format")) is not int:
        return None
    return doc
