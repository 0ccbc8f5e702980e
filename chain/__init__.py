"""infervisor.chain: the node's append-only, BLAKE3 hash-chained event log in SQLite.

Imports nothing else from infervisor. The format is specified in
docs/chain-format.md. Errors are `ChainError` subclasses (see `errors`);
sqlite3 errors never escape.
"""

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
