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
