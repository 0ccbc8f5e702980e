"""The host's routing table, published for readers on any thread.

The host actor is the only writer. Whenever an instance is added, removed or
starts being unloaded, it builds a new frozen :class:`RouteTable` and swaps it
in whole (one attribute assignment: atomic). Readers, the
:class:`~.node.Node` verbs, read :attr:`Routes.current` once and use that
snapshot; they never ask the host, so a host busy with an admission or an
unload never delays a verb to another instance.

An instance being unloaded is in :attr:`RouteTable.unloading` and not in
:attr:`RouteTable.refs`: verbs are no longer routed to it
(:meth:`RouteTable.lookup` raises :class:`~.errors.InvalidState` saying so).
Once its unload is durable it leaves the table altogether
(:class:`~.errors.UnknownInstance`); an unload that fails routes it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pykka

from .errors import InvalidState, UnknownInstance

__all__ = ["RouteTable", "Routes"]


@dataclass(frozen=True)
class RouteTable:
    """One immutable snapshot: ``refs`` maps each routed instance id to its actor;
    ``unloading`` holds the ids being unloaded (not routed)."""

    refs: Mapping[str, pykka.ActorRef[Any]]
    unloading: frozenset[str]

    @classmethod
    def of(
        cls, refs: Mapping[str, pykka.ActorRef[Any]], unloading: Iterable[str] = ()
    ) -> RouteTable:
        """A table routing ``refs`` except the ids in ``unloading`` (both copied)."""
        gone = frozenset(unloading)
        routed = {iid: ref for iid, ref in refs.items() if iid not in gone}
        return cls(MappingProxyType(routed), gone)

    def lookup(self, instance_id: str) -> pykka.ActorRef[Any]:
        """The actor to send ``instance_id``'s verbs to.

        Raises:
            InvalidState: the instance is being unloaded.
            UnknownInstance: no such instance (the message lists those placed).
        """
        ref = self.refs.get(instance_id)
        if ref is not None:
            return ref
        if instance_id in self.unloading:
            raise InvalidState(
                f"{instance_id} is being unloaded: it takes no more verbs; "
                "once the unload is answered it is gone (or routed again if the unload failed)"
            )
        raise UnknownInstance(instance_id, list(self.refs))


EMPTY = RouteTable.of({})


class Routes:
    """Holds the current :class:`RouteTable`; the host swaps it, anyone reads it."""

    def __init__(self) -> None:
        self._current = EMPTY
        self._version = 0

    @property
    def version(self) -> int:
        """How many tables were published (an instance added, removed, unloading)."""
        return self._version

    @property
    def current(self) -> RouteTable:
        """The latest published snapshot (never changes once read)."""
        return self._current

    def publish(self, table: RouteTable) -> None:
        """Swap in ``table`` (the host's thread only)."""
        self._current = table
        self._version += 1  # after the swap: a reader of the new version sees the new table
