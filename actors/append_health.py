"""Whether the chain takes appends now: the node's one answer, shared by reference.

The chain writer reports each transaction's outcome here; the node's status
(``GET /v1/node``, ``infervisor status``) and ``/metrics`` read it from any
thread without asking the writer, which may be blocked on the write lock for
up to ``chain.connect.BUSY_TIMEOUT_S`` seconds. A refused write is the disk
being full (``SQLITE_FULL``), another process holding the write lock past the
busy timeout (``SQLITE_BUSY``), or any other ``ChainError`` of an append.

Each run of failures is logged once per kind of error (the first failure, and
any failure whose message differs from the last one logged), and its end once,
so a long outage retried every few seconds does not flood the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["AppendHealth", "AppendStatus"]

log = logging.getLogger(__name__)


class AppendStatus(NamedTuple):
    """The chain's write health read at one moment.

    Attributes:
        writable: the last append transaction committed (True before any).
        error: the last failure's message while not writable, else None.
        since_ns: when the current run of failures began, ns since the Unix
            epoch (UTC); None while writable.
        failures: failed append transactions since the node started (a counter).
    """

    writable: bool
    error: str | None
    since_ns: int | None
    failures: int


class AppendHealth:
    """Thread-safe record of whether appends succeed (see the module docstring)."""

    def __init__(self, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self._wall_ns = wall_ns
        self._lock = threading.Lock()
        self._error: str | None = None
        self._since_ns: int | None = None
        self._failures = 0
        self._failed_in_run = 0

    def failed(self, error: BaseException) -> None:
        """One append transaction failed with ``error`` (nothing of it is stored)."""
        why = f"{type(error).__name__}: {error}"
        with self._lock:
            new_kind = why != self._error
            self._error = why
            if self._since_ns is None:
                self._since_ns = self._wall_ns()
            self._failures += 1
            self._failed_in_run += 1
        if new_kind:
            log.error("the chain refuses writes: %s; observations wait until it takes them", why)

    def succeeded(self) -> None:
        """One append transaction committed: the chain takes writes (again)."""
        with self._lock:
            if self._since_ns is None:
                return
            failed, self._failed_in_run = self._failed_in_run, 0
            self._error = self._since_ns = None
        log.warning("the chain takes writes again, after %d failed appends", failed)

    def snapshot(self) -> AppendStatus:
        """The status now (see :class:`AppendStatus`)."""
        with self._lock:
            writable = self._since_ns is None
            return AppendStatus(writable, self._error, self._since_ns, self._failures)
