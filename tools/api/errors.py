"""The control API's errors: what a client raises for each answer.

It imports nothing of the node, so a client loads quickly; how the node's
own exceptions become answers is :mod:`.answers`. The tree is::

    ApiError                 any error of the API (``code``, ``status``, ``field``)
     +-- NodeUnavailable     no node takes requests now (also a ConnectionError)
     |    +-- NotRunning     no socket, or nothing listens on it / at the URL
     |    +-- NoAnswer       it takes the connection but does not answer in time
     |    +-- NodeStarting   503 node_starting: the node is resuming from its chain
     |    +-- NodeStopping   503 node_stopping: the node is shutting down
     +-- VerbFailed          the node refused or failed the request (4xx/5xx), by code
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "ApiRefusal",
    "NoAnswer",
    "NodeStarting",
    "NodeStopping",
    "NodeUnavailable",
    "NotRunning",
    "VerbFailed",
]


class ApiError(Exception):
    """Base of the API's errors; ``code`` is stable (docs/cli.md), ``status`` the HTTP one."""

    def __init__(
        self, message: str, code: str = "node_error", status: int = 500, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.field = field


class NodeUnavailable(ApiError, ConnectionError):
    """No node takes requests at that address now."""


class NotRunning(NodeUnavailable):
    """Nothing listens there: no node runs on the data directory (or at the URL)."""


class NoAnswer(NodeUnavailable):
    """The node took the connection but did not answer within the timeout: it is
    stopped (SIGSTOP), frozen or overloaded. ``code`` is ``no_answer`` (the node is
    there), or ``node_unreachable`` for a TCP connect that timed out (nothing took
    the connection)."""


class NodeStarting(NodeUnavailable):
    """The node holds the data directory but is still resuming from its chain."""


class NodeStopping(NodeUnavailable):
    """The node is shutting down (or went away during the answer)."""


class VerbFailed(ApiError):
    """The node refused or failed the request; ``code`` says how."""


class ApiRefusal(ApiError):
    """Raised inside the server for a refusal of its own (auth, gate, idempotency)."""
