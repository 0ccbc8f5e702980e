"""Which requests the node takes now, and the verbs in flight.

None while the node opens (503 ``node_starting``), every one once it is
open, only those that change nothing once its shutdown begins (503
``node_stopping``). :meth:`Gate.stopping` returns once the changing verbs
already admitted are answered, so none of them acts after the node began
stopping its servers.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator

from infervisor.actors.node import Node

from .errors import NodeStarting, NodeStopping

__all__ = ["Gate", "Phase"]


class Phase(enum.Enum):
    """The node's phase as the API sees it."""

    STARTING = "starting"
    OPEN = "open"
    STOPPING = "stopping"


class Gate:
    """The phase, the node once open, and a count of changing verbs in flight."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._phase = Phase.STARTING
        self._node: Node | None = None
        self._changing = 0

    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self._phase

    @property
    def node(self) -> Node | None:
        """The node once open (None while starting)."""
        return self._node

    def open(self, node: Node) -> None:
        """Take every request for ``node`` from now on."""
        with self._cond:
            self._node, self._phase = node, Phase.OPEN

    def stopping(self, timeout_s: float | None = None) -> bool:
        """Refuse changes from now on; True once none is in flight (False: timed out)."""
        with self._cond:
            self._phase = Phase.STOPPING
            return self._cond.wait_for(lambda: self._changing == 0, timeout_s)

    def close(self) -> None:
        """The node is shut down: every request is refused (503 ``node_stopping``)."""
        with self._cond:
            self._phase, self._node = Phase.STOPPING, None

    @property
    def in_flight(self) -> int:
        """Changing verbs being done now."""
        return self._changing

    @contextlib.contextmanager
    def admit(self, *, changes: bool) -> Iterator[Node]:
        """The node, for one request; a changing one is counted while it runs.

        Raises:
            NodeStarting: the node is not open yet (503).
            NodeStopping: a change while the node shuts down (503).
        """
        with self._cond:
            if self._node is None and self._phase is Phase.STOPPING:
                raise NodeStopping("the node has shut down", "node_stopping", 503)
            if self._node is None:
                raise NodeStarting(
                    "the node is starting (resuming from its chain); try again",
                    "node_starting",
                    503,
                )
            if changes and self._phase is not Phase.OPEN:
                raise NodeStopping(
                    "the node is shutting down; it takes no more changes",
                    "node_stopping",
                    503,
                )
            node = self._node
            self._changing += int(changes)
        try:
            yield node
        finally:
            if changes:
                with self._cond:
                    self._changing -= 1
                    self._cond.notify_all()
