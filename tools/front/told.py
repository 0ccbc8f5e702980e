"""The node told of the front's requests, those of one event-loop turn at once.

Each routed request's beginning and end reach the node (``Node.request_began``,
``request_ended``: an actor tell each, so a busy instance is never evicted nor
expired, and idle time is known). A tell costs the node a message and a run of
its instance's decision core; 64 streams begun together were 64 of them, and
as many at their ends (about a quarter of the front's CPU per request in
bench/README.md's stop 33). Here the requests that began or ended on one
instance within one turn of the front's event loop are told as one count, at
the end of that turn (``loop.call_soon``): the counts stay exact, and what the
node learns is late by that turn only (the tells were never synchronous).
Beginnings are told before ends, so an instance busy throughout never looks
idle between the two.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infervisor.actors.node import Node

__all__ = ["Told"]


class Told:
    """Requests begun and ended per instance, not yet told (event loop thread only)."""

    __slots__ = ("_armed", "_began", "_ended", "node")

    def __init__(self, node: Node) -> None:
        self.node = node
        self._began: dict[str, int] = {}
        self._ended: dict[str, int] = {}
        self._armed = False

    def began(self, instance_id: str) -> None:
        """A request routed to ``instance_id`` began."""
        self._began[instance_id] = self._began.get(instance_id, 0) + 1
        self._arm()

    def ended(self, instance_id: str) -> None:
        """A request routed to ``instance_id`` ended (answered, failed or cancelled)."""
        self._ended[instance_id] = self._ended.get(instance_id, 0) + 1
        self._arm()

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Tell the node now (beginnings first)."""
        began, ended = self._began, self._ended
        self._began, self._ended, self._armed = {}, {}, False
        for iid, n in began.items():
            self.node.request_began(iid, n)
        for iid, n in ended.items():
            self.node.request_ended(iid, n)
