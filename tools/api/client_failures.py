"""What a request of :class:`~.client.ApiClient` that failed raises: the API's errors.

httpx's transport errors and the node's error answers become the errors of
:mod:`.errors` here, as httpx maps httpcore's at its edge: ``NotRunning`` when
nothing listens, ``NoAnswer`` when the node is there (it took the connection)
but does not answer in time (``no_answer``; a verb sent may have been
recorded; a stopped node is named with its pid and ``kill -CONT``),
``NodeStopping`` when the node went away midway,
``NodeStarting``/``NodeStopping`` for a 503 and ``VerbFailed`` (the stable
``code``, the HTTP ``status`` and the ``field``) for every other refusal.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .errors import NoAnswer, NodeStarting, NodeStopping, NodeUnavailable, NotRunning, VerbFailed
from .wire import ErrorEnvelope

if TYPE_CHECKING:
    import httpx
else:
    from .lazy_httpx import httpx

__all__ = ["RequestFailures", "raise_for"]

_UNAVAILABLE: dict[str, type[NodeUnavailable]] = {
    "node_starting": NodeStarting,
    "node_stopping": NodeStopping,
}


@dataclasses.dataclass(frozen=True)
class RequestFailures:
    """The errors of requests to the node at ``where`` (its data directory or URL),
    reached through ``socket`` (its control socket; None: through the URL)."""

    where: str
    socket: Path | None

    def transport(self, error: httpx.TransportError, method: str) -> NodeUnavailable:
        """A request that got no answer: a verb (POST) whose connection dropped after
        it was sent is NodeStopping (it may have been recorded), anything else as
        :meth:`unreachable` says."""
        if method == "POST" and not isinstance(error, httpx.ConnectError):
            return NodeStopping(
                f"the node at {self.where} went away before answering ({error}): the verb "
                "may have been recorded: see `infervisor status` or `infervisor watch` "
                "once the node is back before asking again",
                "no_answer",
                0,
            )
        return self.unreachable(error)

    def no_answer(
        self, error: httpx.TimeoutException, method: str, timeout_s: float | None
    ) -> NoAnswer:
        """No answer in time (``timeout_s``, seconds; None: a stream gone silent).

        The node is there but does not answer (``no_answer``, exit 4): it took the
        connection (its socket's queue or the kernel's accept queue), or its socket
        listens with a full queue; a stopped process (SIGSTOP) is named with its
        pid and how to resume it. A verb sent may have been recorded. Only a TCP
        connect that timed out is ``node_unreachable`` (exit 3): nothing took the
        connection, which says nothing of a node there (a firewall drops it too).
        """
        within = f"within {timeout_s:g} s" if timeout_s is not None else "in time"
        connect = isinstance(error, httpx.ConnectTimeout)
        if connect and self.socket is None:
            return NoAnswer(
                f"nothing at {self.where} took the connection {within}: no node listens "
                "there and something drops the connection, or the node's queue is full "
                "(a paused node: SIGSTOP, a frozen cgroup or VM)",
                "node_unreachable",
                0,
            )
        where = f"{self.where} (socket {self.socket})" if self.socket is not None else self.where
        took = "listens (its queue is full)" if connect else "took the connection"
        message = f"the node at {where} {took} but did not answer {within}: {self._why_silent()}"
        if method == "POST" and not connect:
            message += (
                "; the verb may have been recorded: see `infervisor status` or "
                "`infervisor watch` once the node answers before asking again"
            )
        return NoAnswer(message, "no_answer", 0)

    def _why_silent(self) -> str:
        """Why a node that is there may not answer: its process stopped (named, with
        the command that resumes it), else the causes a client cannot tell apart."""
        found = None
        if self.socket is not None:
            from .uds import listener  # noqa: PLC0415 - loads httpcore, as the request did

            found = listener(str(self.socket))
        if found is not None and found.stopped:
            return f"its process (pid {found.pid}) is stopped: `kill -CONT {found.pid}` resumes it"
        pid = f"its process (pid {found.pid}) runs, but " if found is not None else ""
        return (
            f"{pid}it is paused (a stopped process: `kill -CONT PID`; a frozen cgroup; "
            "a paused VM), stuck or overloaded"
        )

    def unreachable(self, error: httpx.TransportError) -> NodeUnavailable:
        """Nothing listens (NotRunning), a stream went silent (NoAnswer) or the
        connection dropped (NodeStopping: the node is restarting or shutting down)."""
        if isinstance(error, httpx.ConnectError):
            if self.socket is not None:
                return self.not_running()
            return NotRunning(f"nothing answers at {self.where}: {error}", "no_node", 0)
        if isinstance(error, httpx.TimeoutException):
            return self.no_answer(error, "GET", None)  # a stream gone silent
        return NodeStopping(f"the node at {self.where} went away: {error}", "node_stopping", 0)

    def not_running(self) -> NotRunning:
        """Nothing answers on the node's socket (it is missing or refuses connections)."""
        return NotRunning(
            f"no node is running on {self.where} (nothing answers on {self.socket}); "
            "start one with `infervisor run CONFIG`",
            "no_node",
            0,
        )


def raise_for(response: httpx.Response) -> None:
    """Nothing for an answer below 400; else the refusal it carries (its error
    envelope), or ``VerbFailed`` ``node_error`` when it carries none."""
    if response.status_code < 400:
        return
    try:
        error = msgspec.json.decode(response.content, type=ErrorEnvelope).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise VerbFailed(
            f"HTTP {response.status_code}: {response.text[:200]}",
            "node_error",
            response.status_code,
        ) from None
    unavailable = _UNAVAILABLE.get(error.code)
    if unavailable is not None:
        raise unavailable(error.message, error.code, response.status_code, error.field)
    raise VerbFailed(error.message, error.code, response.status_code, error.field)
