"""The event observer: hands durable events to a callback off the writer's critical path.

The chain writer offers each event once it is durable; :meth:`EventObserver.offer`
never blocks. Events wait in a bounded buffer drained by the observer's own
thread, which calls the callback one event at a time, in seq order.

When the buffer is full the **oldest** waiting event is dropped and counted
(:attr:`EventObserver.dropped`); the observer's thread logs a warning with the
running count before it delivers the next event. The chain still holds every
event: only the live view (``infervisor run``'s stderr) misses them.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable

from infervisor.chain import StoredEvent

__all__ = ["DEFAULT_CAPACITY", "EventObserver"]

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 4096
"""Events the buffer holds before it drops the oldest."""


class EventObserver:
    """A bounded buffer of events and the thread that hands them to ``callback``.

    Args:
        callback: called on the observer's thread with each event; its errors
            are logged and never stop the observer.
        capacity: events buffered before the oldest is dropped (at least 1).
    """

    def __init__(
        self, callback: Callable[[StoredEvent], None], capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if capacity < 1:
            raise ValueError(f"observer capacity must be at least 1, got {capacity}")
        self._callback = callback
        self._buffer: collections.deque[StoredEvent] = collections.deque()
        self._capacity = capacity
        self._ready = threading.Condition()
        self._closing = False
        self._dropped = 0
        self._reported = 0
        self._thread = threading.Thread(target=self._run, name="event-observer", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Events dropped so far because the buffer was full."""
        with self._ready:
            return self._dropped

    def offer(self, events: Iterable[StoredEvent]) -> None:
        """Buffer ``events`` for the callback; never blocks on the callback."""
        with self._ready:
            for event in events:
                if len(self._buffer) >= self._capacity:
                    self._buffer.popleft()
                    self._dropped += 1
                self._buffer.append(event)
            self._ready.notify()

    def close(self, timeout_s: float = 1.0) -> None:
        """Deliver what is buffered, waiting at most ``timeout_s`` seconds, then stop.

        A callback still stalled after ``timeout_s`` is abandoned (the thread
        is a daemon); whatever it had not delivered is lost to the live view.
        """
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("event observer still busy after %.1f s; abandoned", timeout_s)

    def _run(self) -> None:
        while (event := self._next()) is not None:
            try:
                self._callback(event)
            except Exception:
                log.exception("event observer failed on seq %d", event.seq)

    def _next(self) -> StoredEvent | None:
        """The next event to deliver, or None once closing and empty."""
        with self._ready:
            while not self._buffer and not self._closing:
                self._ready.wait()
            if self._dropped > self._reported:
                log.warning(
                    "event observer fell behind: %d events dropped so far (they are in the chain)",
                    self._dropped,
                )
                self._reported = self._dropped
            return self._buffer.popleft() if self._buffer else None
