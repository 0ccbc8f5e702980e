"""The chain writer: the only writer of the node's SQLite chain."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import pykka

from infervisor.chain import SqliteChain, StoredEvent

from .messages import Append

__all__ = ["ChainWriter"]

log = logging.getLogger(__name__)


class ChainWriter(pykka.ThreadingActor):
    """Appends events and answers once they are durable (WAL, ``synchronous=FULL``).

    ``on_event``, when given, is called on this actor's thread with each
    event once it is durable (for live output); it must be quick.

    One message is one transaction: the drafts of an :class:`Append` are
    written together (``append_many``), and each asker gets its own stored
    events. Appends from different actors are serialised by this actor's inbox.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        node_id: str,
        on_event: Callable[[StoredEvent], None] | None = None,
    ) -> None:
        super().__init__()
        self._path = path
        self._node_id = node_id
        self._on_event = on_event
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
        stored = self._chain.append_many(message.drafts)
        if self._on_event is not None:
            for event in stored:
                self._notify(event)
        return stored

    def _notify(self, event: StoredEvent) -> None:
        """Tell the observer (after the event is durable); its errors never fail an append."""
        assert self._on_event is not None
        try:
            self._on_event(event)
        except Exception:
            log.exception("event observer failed on seq %d", event.seq)
