"""Event records: the draft a caller builds and the event the chain stores.

Timestamps (`ts_ns`) are integer nanoseconds since the Unix epoch, UTC.
Payloads are opaque bytes to the chain; `encode_payload` produces the
canonical form callers should use. The bytes are stored exactly as they were
hashed and are never re-encoded to verify.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from infervisor.chain.errors import InvalidEventError

GENESIS_KIND = "chain.genesis"
"""Kind of the event at seq 0; no other event may have it."""

GENESIS_SOURCE = "node"
"""Source of the genesis event."""

FORMAT_VERSION = 1
"""Version of the chain format (docs/chain-format.md) this code writes and reads."""

HASH_NAME = "blake3"
"""Hash function named in the genesis payload."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1


class EventDraft(msgspec.Struct, frozen=True, kw_only=True):
    """An event before it is appended: everything but its place in the chain.

    Attributes:
        ts_ns: wall-clock time of the decision, integer ns since the Unix epoch, UTC.
        source: who decided: "operator", "supervisor", "controller", "node", ...
        kind: what happened, e.g. "instance.placed"; never `GENESIS_KIND`.
        subject: the instance id, or "" for node-level events.
        payload: canonical payload bytes, normally from `encode_payload`.
    """

    ts_ns: int
    source: str
    kind: str
    subject: str
    payload: bytes


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event as stored in the chain.

    Attributes:
        seq: position in the chain; genesis is 0, then 1, 2, ... with no gaps.
        ts_ns: integer ns since the Unix epoch, UTC.
        node: id of the node whose chain this is.
        source, kind, subject, payload: as in `EventDraft`.
        payload_hash: 32-byte BLAKE3 (derive_key mode) of `payload`.
        prev_hash: `hash` of the event at `seq - 1`; 32 zero bytes for genesis.
        hash: 32-byte BLAKE3 (derive_key mode) of this event's header.
    """

    seq: int
    ts_ns: int
    node: str
    source: str
    kind: str
    subject: str
    payload: bytes
    payload_hash: bytes
    prev_hash: bytes
    hash: bytes

    def hash_hex(self) -> str:
        """Return `hash` as 64 lowercase hex digits."""
        return self.hash.hex()


def encode_payload(obj: object) -> bytes:
    """Encode a payload canonically: JSON (msgspec) with object keys sorted.

    Args:
        obj: anything msgspec can encode (dicts need str keys).

    Returns:
        UTF-8 JSON bytes; equal objects give equal bytes.

    Raises:
        InvalidEventError: `obj` cannot be encoded.
    """
    try:
        return msgspec.json.encode(obj, order="sorted")
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEventError(f"payload cannot be encoded as canonical JSON: {exc}") from exc


def genesis_payload(node_id: str) -> bytes:
    """Return the canonical genesis payload for `node_id`."""
    return encode_payload({"format": FORMAT_VERSION, "node": node_id, "hash": HASH_NAME})


def genesis_draft(node_id: str, ts_ns: int) -> EventDraft:
    """Return the draft of the genesis event of `node_id`'s chain.

    Raises:
        InvalidEventError: `ts_ns` is not an int within signed 64 bits.
    """
    _check_ts(ts_ns)
    return EventDraft(
        ts_ns=ts_ns,
        source=GENESIS_SOURCE,
        kind=GENESIS_KIND,
        subject="",
        payload=genesis_payload(node_id),
    )


def check_node_id(node_id: object) -> str:
    """Return `node_id` if it can name a chain's node.

    Raises:
        InvalidEventError: not a non-empty str of valid UTF-8.
    """
    return _check_text("node_id", node_id, allow_empty=False)


def check_draft(draft: EventDraft) -> None:
    """Refuse a draft the chain format cannot represent or that is not appendable.

    Raises:
        InvalidEventError: naming the field, its value and what is allowed.
    """
    if not isinstance(draft, EventDraft):
        raise InvalidEventError(f"expected an EventDraft, got {type(draft).__name__}")
    _check_ts(draft.ts_ns)
    _check_text("source", draft.source, allow_empty=False)
    _check_text("kind", draft.kind, allow_empty=False)
    _check_text("subject", draft.subject, allow_empty=True)
    if draft.kind == GENESIS_KIND:
        raise InvalidEventError(f"kind {GENESIS_KIND!r} is reserved for the event at seq 0")
    if not isinstance(draft.payload, bytes):
        raise InvalidEventError(
            f"payload must be bytes (use encode_payload), got {type(draft.payload).__name__}"
        )


def check_drafts(drafts: Iterable[EventDraft]) -> list[EventDraft]:
    """Check every draft (see `check_draft`) and return them as a list."""
    checked = list(drafts)
    for draft in checked:
        check_draft(draft)
    return checked


def _check_ts(ts_ns: object) -> None:
    if type(ts_ns) is not int or not INT64_MIN <= ts_ns <= INT64_MAX:
        raise InvalidEventError(
            f"ts_ns must be an int of ns since the Unix epoch within signed 64 bits, got {ts_ns!r}"
        )


def _check_text(name: str, value: object, *, allow_empty: bool) -> str:
    if not isinstance(value, str):
        raise InvalidEventError(f"{name} must be a str, got {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidEventError(f"{name} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidEventError(f"{name} is not encodable as UTF-8: {value!r}") from exc
    if size > UINT32_MAX:
        raise InvalidEventError(f"{name} is {size} bytes long; at most {UINT32_MAX} allowed")
    return value
