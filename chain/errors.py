"""Errors raised by `infervisor.chain`.

Callers never see `sqlite3` exceptions: the store translates them here, at
the edge. The tree::

    ChainError                      anything the chain refuses or cannot do
    ├── ChainIOError                cannot open, read or write the file (missing,
    │   │                           not SQLite, locked too long, closed, read-only)
    │   └── ChainFormatError        a SQLite file, but not a chain this code reads
    ├── ChainIntegrityError         an append or change that would fork, gap or
    │                               rewrite the chain was refused
    ├── NodeMismatch                the chain's genesis names another node
    └── InvalidEventError           a draft that cannot be stored (also a ValueError)
"""

from __future__ import annotations


class ChainError(Exception):
    """Base class of every error raised by `infervisor.chain`."""


class ChainIOError(ChainError):
    """The chain file cannot be opened, read or written.

    The command line maps this to exit status 2 ("could not check").
    """


class ChainFormatError(ChainIOError):
    """The file is a SQLite database but not a chain of a supported format."""


class ChainIntegrityError(ChainError):
    """An append, update or delete that would fork, gap or rewrite the chain."""


class NodeMismatch(ChainError):
    """The chain file belongs to another node.

    Attributes:
        expected: the node id the caller asked for.
        found: the node id named by the chain's genesis event.
    """

    def __init__(self, path: str, expected: str, found: str) -> None:
        super().__init__(
            f"chain {path} belongs to node {found!r}, not {expected!r}: "
            "open it with that node id, or give this node its own chain file"
        )
        self.expected = expected
        self.found = found


class InvalidEventError(ChainError, ValueError):
    """A draft (or node id) that the chain format cannot represent."""


# Checkpoints, proofs, notes and bundles (chain/merkle.py, note.py, checkpoint.py,
# checkpoint_store.py, boot.py, bundle.py). Appended to the tree above:
#
#   ChainError
#   ├── ProofError               a Merkle inclusion or consistency proof does not verify
#   ├── NoteError                a signed note (or key string) is malformed or unsigned
#   ├── CheckpointError          a checkpoint is malformed, unsigned, or not this chain's
#   │   └── CheckpointMismatch   the chain contradicts a signed checkpoint (truncated,
#   │                            rewritten, forked): carries seq and reason
#   ├── ChainTampered            the node refuses to resume on a chain that fails its
#   │                            boot check: carries seq and reason
#   └── BundleError              an export bundle cannot be read or does not verify


class ProofError(ChainError):
    """A Merkle proof (RFC 6962 / RFC 9162) does not verify or cannot be built."""


class NoteError(ChainError):
    """A C2SP signed note, or a key string, is malformed, or no known key signed it."""


class CheckpointError(ChainError):
    """A checkpoint cannot be used: malformed body, bad signature, another node's."""


class CheckpointMismatch(CheckpointError):
    """The chain contradicts a checkpoint that verified.

    Attributes:
        seq: the first sequence number known to be affected.
        reason: "truncated", "rewritten", "forked" or "head mismatch".
    """

    def __init__(self, seq: int, reason: str, detail: str) -> None:
        super().__init__(f"{reason} at seq {seq}: {detail}")
        self.seq = seq
        self.reason = reason
        self.detail = detail


class ChainTampered(ChainError):
    """The node's chain failed the check before resuming; the node refuses to run on it.

    Attributes:
        seq: the sequence number where the check failed.
        reason: what failed (a verification reason, or "truncated", "rewritten", ...).
    """

    def __init__(self, path: str, seq: int, reason: str, detail: str) -> None:
        aside = f"{path}.evidence"
        super().__init__(
            f"chain {path} failed its check before resuming: {reason} at seq {seq}: {detail}. "
            f"The node refuses to resume on it. Keep it as evidence and start anew: stop, "
            f"move it aside with its side files (mv {path} {aside}; mv {path}-wal "
            f"{aside}-wal; mv {path}-shm {aside}-shm, where they exist), keep the node key "
            f"to check its checkpoints later, and run again: a new chain is created"
        )
        self.path = path
        self.seq = seq
        self.reason = reason
        self.detail = detail


class BundleError(ChainError):
    """An export bundle cannot be read, or does not verify.

    Attributes:
        seq: the sequence number at fault, or None for a bundle-wide problem.
        reason: what is wrong: a verification reason ("payload altered", "truncated",
            ...), "manifest" (the manifest's shape, or a claim the contents
            contradict), "checkpoint signature", "node key", "no key", "unreadable".
    """

    def __init__(self, message: str, *, seq: int | None = None, reason: str = "bundle") -> None:
        super().__init__(message)
        self.seq = seq
        self.reason = reason
