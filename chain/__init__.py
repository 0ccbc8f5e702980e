"""infervisor.chain: the node's append-only, BLAKE3 hash-chained event log in SQLite.

Imports nothing else from infervisor. The format is specified in
docs/chain-format.md. Errors are `ChainError` subclasses (see `errors`);
sqlite3 errors never escape.

The names below load when first asked for (chain/lazy.py): a client that needs
one record type does not load the store and the verifier with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infervisor.chain.lazy import lazy_names

if TYPE_CHECKING:
    from infervisor.chain.checks import Problem, Reason
    from infervisor.chain.errors import (
        ChainError,
        ChainFormatError,
        ChainIntegrityError,
        ChainIOError,
        InvalidEventError,
        NodeMismatch,
    )
    from infervisor.chain.hashing import EVENT_CONTEXT, PAYLOAD_CONTEXT, ZERO_HASH
    from infervisor.chain.memory import MemoryChain
    from infervisor.chain.records import (
        FORMAT_VERSION,
        GENESIS_KIND,
        EventDraft,
        StoredEvent,
        encode_payload,
    )
    from infervisor.chain.sqlite import SqliteChain
    from infervisor.chain.store import Chain
    from infervisor.chain.verify import Consumer, VerifyReport, scan_chain, verify_chain

#: Where each public name lives.
_HOME: dict[str, str] = {
    "Chain": "store",
    "ChainError": "errors",
    "ChainFormatError": "errors",
    "ChainIOError": "errors",
    "ChainIntegrityError": "errors",
    "Consumer": "verify",
    "EVENT_CONTEXT": "hashing",
    "EventDraft": "records",
    "FORMAT_VERSION": "records",
    "GENESIS_KIND": "records",
    "InvalidEventError": "errors",
    "MemoryChain": "memory",
    "NodeMismatch": "errors",
    "PAYLOAD_CONTEXT": "hashing",
    "Problem": "checks",
    "Reason": "checks",
    "SqliteChain": "sqlite",
    "StoredEvent": "records",
    "VerifyReport": "verify",
    "ZERO_HASH": "hashing",
    "encode_payload": "records",
    "scan_chain": "verify",
    "verify_chain": "verify",
}

__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())

__all__ = [
    "EVENT_CONTEXT",
    "FORMAT_VERSION",
    "GENESIS_KIND",
    "PAYLOAD_CONTEXT",
    "ZERO_HASH",
    "Chain",
    "ChainError",
    "ChainFormatError",
    "ChainIOError",
    "ChainIntegrityError",
    "Consumer",
    "EventDraft",
    "InvalidEventError",
    "MemoryChain",
    "NodeMismatch",
    "Problem",
    "Reason",
    "SqliteChain",
    "StoredEvent",
    "VerifyReport",
    "encode_payload",
    "scan_chain",
    "verify_chain",
]
