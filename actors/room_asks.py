"""Starts the node decided itself that need room (issue 21): a restart whose
backoff came due, or a boot resuming an instance wanted running, that does not
fit the memory budget. The decision core asks for room as an effect
(``AskRoom``, actors/core/common.py); an instance's actor hands the ask here
from its own thread, and it must not wait for the evictions. One thread of
their own carries the asks out, one at a time, through the node's planner
(:meth:`~.node_residency.NodeResidency.node_start`).

The instances' context is built before the node (boot decides before the node
object exists), so asks made by the boot wait here until the node attaches.
An instance already waiting is not queued twice: its reconcile tick asks
again each time its start is refused.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["RoomAsks"]

log = logging.getLogger(__name__)

#: Carries out one ask: ``(instance id, by, cause)``.
Carry = Callable[[str, str, str], None]


class RoomAsks:
    """The node-decided starts waiting for room (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[str, tuple[str, str]] = {}
        self._wake = threading.Condition(self._lock)
        self._carry: Carry | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def ask(self, iid: str, by: str, cause: str) -> None:
        """Queue a start of ``iid`` by ``by`` (never blocks); once queued, asks
        for the same instance join it until it is carried out."""
        with self._lock:
            if self._closed or iid in self._queued:
                return
            self._queued[iid] = (by, cause)
            self._wake.notify()

    def attach(self, carry: Carry) -> None:
        """Carry the asks out with ``carry`` from now on (the node, once open),
        those queued first."""
        with self._lock:
            if self._closed or self._thread is not None:
                return
            self._carry = carry
            self._thread = threading.Thread(target=self._run, name="room-asks", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Carry out no more asks (the node shuts down: nothing is evicted then)."""
        with self._lock:
            self._closed = True
            self._queued.clear()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                iid, (by, cause) = next(iter(self._queued.items()))
                carry = self._carry
            assert carry is not None
            try:
                carry(iid, by, cause)
            except Exception:  # the thread must outlive any one ask
                log.exception("%s: making room for its start failed", iid)
            finally:
                with self._lock:
                    self._queued.pop(iid, None)
