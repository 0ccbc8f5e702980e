"""The chain writer: the only writer of the node's SQLite chain."""

from __future__ import annotations

import os
from typing import Any

import pykka

from infervisor.chain import SqliteChain, StoredEvent

from .messages import Append

__all__ = ["ChainWriter"]


class ChainWriter(pykka.ThreadingActor):
    """Appends events and answers once they are durable (WAL, ``synchronous=FULL``).

    One message is one transaction: the drafts of an :class:`Append` are
    written together (``append_many``), and each asker gets its own stored
    events. Appends from different actors are serialised by this actor's inbox.
    """

    def __init__(self, path: str | os.PathLike[str], node_id: str) -> None:
        super().__init__()
        self._path = path
        self._node_id = node_id
        self._chain: SqliteChain | None = None

    def on_start(self) -> None:
        self._chain = SqliteChain.open(self._path, self._node_id)

    def on_stop(self) -> None:
        if self._chain is not None:
            self._chain.close()

    def on_receive(self, message: Any) -> list[StoredEvent]:
        if not isinstance(message, Append):
            raise TypeError(f"ChainWriter takes Append, not {type(message).__name__}")
        assert self._chain is not None
        return self._chain.append_many(message.drafts)
