"""BLAKE3 hashing of payloads and event headers (docs/chain-format.md, "Hashing").

Both hashes use BLAKE3 in derive_key mode with a context string of their own,
so a payload hash can never be mistaken for an event hash.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import blake3

from infervisor.chain.records import EventDraft, StoredEvent, genesis_draft

PAYLOAD_CONTEXT = "infervisor 2026-11 chain payload v1"
EVENT_CONTEXT = "infervisor 2026-11 chain event v1"
HASH_SIZE = 32
ZERO_HASH = bytes(HASH_SIZE)
"""prev_hash of the genesis event."""

_SEQ_TS = struct.Struct(">Qq")
_LENGTH = struct.Struct(">I")


def payload_hash(payload: bytes) -> bytes:
    """Return the 32-byte payload hash of `payload` (BLAKE3 derive_key, payload context)."""
    return blake3.blake3(payload, derive_key_context=PAYLOAD_CONTEXT).digest()


def header_bytes(
    *,
    seq: int,
    ts_ns: int,
    fields: tuple[bytes, bytes, bytes, bytes],
    payload_digest: bytes,
    prev_hash: bytes,
) -> bytes:
    """Return the bytes an event hash covers.

    Args:
        seq: 0 <= seq < 2**64, written as 8-byte big-endian unsigned.
        ts_ns: ns since the Unix epoch, written as 8-byte big-endian signed.
        fields: UTF-8 bytes of node, source, kind and subject, in that order;
            each is written as a 4-byte big-endian length, then the bytes.
        payload_digest: the 32-byte payload hash.
        prev_hash: the 32-byte hash of the previous event.

    Raises:
        struct.error: seq, ts_ns or a field length is out of range.
    """
    parts = [_SEQ_TS.pack(seq, ts_ns)]
    for field in fields:
        parts += (_LENGTH.pack(len(field)), field)
    parts += (payload_digest, prev_hash)
    return b"".join(parts)


def event_hash(header: bytes) -> bytes:
    """Return the 32-byte event hash of `header` (see `header_bytes`)."""
    return blake3.blake3(header, derive_key_context=EVENT_CONTEXT).digest()


def seal(draft: EventDraft, *, seq: int, node: str, prev_hash: bytes) -> StoredEvent:
    """Place `draft` in a chain: compute its hashes and return the stored event.

    Args:
        draft: an event already checked by `records.check_draft`.
        seq: its sequence number (the head's seq + 1; 0 for genesis).
        node: the chain's node id.
        prev_hash: the head's hash (`ZERO_HASH` for genesis).
    """
    digest = payload_hash(draft.payload)
    header = header_bytes(
        seq=seq,
        ts_ns=draft.ts_ns,
        fields=(_utf8(node), _utf8(draft.source), _utf8(draft.kind), _utf8(draft.subject)),
        payload_digest=digest,
        prev_hash=prev_hash,
    )
    return StoredEvent(
        seq=seq,
        ts_ns=draft.ts_ns,
        node=node,
        source=draft.source,
        kind=draft.kind,
        subject=draft.subject,
        payload=draft.payload,
        payload_hash=digest,
        prev_hash=prev_hash,
        hash=event_hash(header),
    )


def seal_genesis(node_id: str, ts_ns: int) -> StoredEvent:
    """Return the genesis event (seq 0) of `node_id`'s chain, stamped `ts_ns`."""
    return seal(genesis_draft(node_id, ts_ns), seq=0, node=node_id, prev_hash=ZERO_HASH)


def seal_after(head: StoredEvent, drafts: Iterable[EventDraft], node: str) -> list[StoredEvent]:
    """Seal `drafts` in order as the events following `head` in `node`'s chain."""
    stored: list[StoredEvent] = []
    for draft in drafts:
        head = seal(draft, seq=head.seq + 1, node=node, prev_hash=head.hash)
        stored.append(head)
    return stored


def _utf8(text: str) -> bytes:
    return text.encode("utf-8")
