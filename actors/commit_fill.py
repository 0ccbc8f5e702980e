"""How the chain writer fills its group commits: the inbox it waits on, and the rule.

Appenders wait for their acknowledgement before they append again, so after a
commit the callers it woke come back one by one. A writer that committed
whatever was queued the moment it was free would take the first few to come
back alone, and the rest would queue behind that small commit: its batches
settle at about half the callers (bench/README.md, "Group commit misses").
So after a commit the writer expects back the callers it covered, plus those
already queued, and waits for them before it commits again, for at most a
bound; the caller that completes the batch is the one that wakes it.

The rule, as a table (``covered``: asks the last commit answered; ``queued``:
appends waiting when it ended; ``took_s``: its duration, seconds):

===================================  ==========================  ===============================
after the last commit                the next batch waits for     at most (from its first append)
===================================  ==========================  ===============================
committed                            ``covered + queued`` asks    ``took_s`` (capped at
                                                                  :data:`MAX_FILL_WAIT_S`), or the
                                                                  writer's ``fill_wait_s``
failed                               1 ask (commits at once)      0
none yet                             1 ask (commits at once)      0
===================================  ==========================  ===============================

The wait also ends as soon as any other message reaches the writer (a stop, a
proxy call), and a lone append after a quiet spell waits for nobody (one ask
was expected). Bounding the wait by the last commit's duration means a batch
never waits longer than the commit it saves would have taken, so the latency
it adds is at most one commit; a caller that does not come back costs that
once, and the next commit expects only what it covered.
"""

from __future__ import annotations

import queue
from typing import Any, NamedTuple

from .messages import Append

__all__ = ["MAX_FILL_WAIT_S", "FillPolicy", "FillWait", "WriterInbox"]

#: The longest an adaptive fill waits, seconds: a slow commit (a disk that refuses
#: writes, a checkpoint signed) must not make every later batch wait as long, and
#: a lone append after a burst must stay well inside the exit-to-durable target
#: (bench/summary.py: p99 under 10 ms).
MAX_FILL_WAIT_S = 0.005


class FillWait(NamedTuple):
    """What the next batch waits for: ``asks`` in all, for at most ``at_most_s`` seconds."""

    asks: int
    at_most_s: float


class FillPolicy:
    """The table of the module docstring, updated after each commit (writer thread only).

    Args:
        fill_wait_s: a fixed bound on the wait, seconds (tests give a generous
            one, so that what fills is known); None: the last commit's duration,
            capped at :data:`MAX_FILL_WAIT_S`. 0 never waits.

    Raises:
        ValueError: ``fill_wait_s`` is negative.
    """

    def __init__(self, fill_wait_s: float | None = None) -> None:
        if fill_wait_s is not None and fill_wait_s < 0:
            raise ValueError(f"fill_wait_s must be >= 0 seconds or None, not {fill_wait_s!r}")
        self._fixed = fill_wait_s
        self.next = FillWait(1, 0.0)

    def committed(self, covered: int, queued: int, took_s: float) -> None:
        """A commit answered ``covered`` asks in ``took_s`` seconds; ``queued`` wait now."""
        bound = min(took_s, MAX_FILL_WAIT_S) if self._fixed is None else self._fixed
        self.next = FillWait(max(1, covered + queued), max(0.0, bound))

    def failed(self) -> None:
        """A commit failed: its callers get the error and retry when they will."""
        self.next = FillWait(1, 0.0)


def _is_append(envelope: Any) -> bool:
    return isinstance(getattr(envelope, "message", None), Append)


class WriterInbox(queue.Queue[Any]):
    """The chain writer's inbox: pykka's FIFO, whose reader can ask to be woken
    only once enough appends wait (:meth:`wait_for_appends`), not by each one.

    Any other message wakes the reader at once. Unbounded, as pykka's is.
    """

    def __init__(self) -> None:
        super().__init__()
        self._appends = 0  # Append envelopes queued
        self._want = 0  # while the reader waits for appends: how many; 0: wake on each put

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item`` (never blocks: unbounded); wake the reader if it waits for it."""
        del block, timeout  # unbounded: a put never waits
        append = _is_append(item)
        with self.mutex:
            self._put(item)
            self.unfinished_tasks += 1
            if append:
                self._appends += 1
            if not append or not self._want or self._appends >= self._want:
                self.not_empty.notify()

    def _get(self) -> Any:
        item = super()._get()
        if _is_append(item):
            self._appends -= 1
        return item

    def take_appends(self) -> tuple[list[Any], Any | None]:
        """Take every Append envelope queued before the first other message, in
        order, and that message (None: none is queued). One lock for them all."""
        taken: list[Any] = []
        other = None
        with self.mutex:
            waiting = self.queue
            while waiting:
                envelope = waiting.popleft()
                if not _is_append(envelope):
                    other = envelope
                    break
                taken.append(envelope)
            self._appends -= len(taken)
        return taken, other

    def appends_waiting(self) -> int:
        """Append envelopes queued now."""
        with self.mutex:
            return self._appends

    def wait_for_appends(self, count: int, timeout_s: float) -> None:
        """Block until ``count`` appends are queued, any other message is, or
        ``timeout_s`` seconds pass (the reader's thread only). Takes nothing."""
        if count <= 0 or timeout_s <= 0:
            return
        with self.not_empty:
            self._want = count
            try:
                self.not_empty.wait_for(
                    lambda: self._appends >= count or len(self.queue) > self._appends, timeout_s
                )
            finally:
                self._want = 0
