"""The chain writer's answer to one append: a pykka Future waited on by one lock.

pykka's ``ThreadingFuture`` waits on a ``threading.Condition``: each answer
builds the condition (an ``RLock``), and each wait allocates a lock, queues it,
and re-takes the condition's lock once woken, all in Python. With 32 callers
each waiting for its own durable append, that was the largest share of the
writer's GIL time after SQLite itself (bench/README.md, "Group commit").
:class:`Latch` is the same contract on one ``threading.Lock``, taken when the
future is made and released by :meth:`~Latch.set`: waiting is one
``acquire`` (GIL released), answering one ``release``.

The contract is pykka's (``pykka.Future``): ``get(timeout=)`` blocks until
answered (:class:`pykka.Timeout` past ``timeout`` seconds), returns the value
or raises the exception set, and may be called again (by any thread) with
the same result; a second ``set``/``set_exception`` raises ``queue.Full``.
``map``, ``filter``, ``join``, ``reduce`` and ``pykka.get_all`` work through the
base class's get hook. Answered by one thread (the writer, or ``ask`` itself
when the writer is gone).
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any, TypeVar

import pykka

__all__ = ["Latch"]

T = TypeVar("T")


class Latch(pykka.Future[T]):
    """A future whose waiters block on one lock until :meth:`set` releases it."""

    def __init__(self) -> None:
        super().__init__()
        self._answered = threading.Lock()
        self._answered.acquire()  # released once, by the answer
        self._value: Any = None
        self._exc_info: Any = None
        self._done = False

    def get(self, *, timeout: float | None = None) -> T:
        """The value set, or raise the exception set; waits up to ``timeout`` seconds.

        Raises:
            pykka.Timeout: not answered within ``timeout`` seconds.
            The exception set by :meth:`set_exception`.
        """
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if not self._done:
            waited = self._answered.acquire(timeout=-1 if timeout is None else max(timeout, 0))
            if not waited:
                raise pykka.Timeout(f"{timeout} seconds")
            self._answered.release()  # every later get, in any thread, passes too
        if self._exc_info is not None:
            _, exc, traceback = self._exc_info
            raise exc.with_traceback(traceback)
        return self._value  # type: ignore[no-any-return]

    def set(self, value: T | None = None) -> None:
        """Answer ``value`` and wake the waiters.

        Raises:
            queue.Full: already answered (or given a get hook).
        """
        self._answer(value, None)

    def set_exception(self, exc_info: Any = None) -> None:
        """Answer an exception (default: the one being handled) and wake the waiters.

        Raises:
            queue.Full: already answered (or given a get hook).
        """
        info: Any = sys.exc_info() if exc_info is None else exc_info
        exc_type, exc, traceback = info
        if exc is None:  # pykka allows (type, None, None)
            exc = exc_type()
        self._answer(None, (exc_type, exc, traceback))

    def _answer(self, value: Any, exc_info: Any) -> None:
        if self._done or self._get_hook is not None:
            raise queue.Full
        self._value, self._exc_info = value, exc_info
        self._done = True
        self._answered.release()
