"""The control API's client: what the command line and controllers use.

It finds the node through its data directory's socket
(``<data_dir>/api.sock``) or a URL with a bearer token. Every verb blocks
until the node answers (the node bounds each: a stop, its grace plus 30 s).
Errors are those of :mod:`.errors`: ``NotRunning`` when nothing listens,
``NodeStarting``/``NodeStopping`` for 503, ``VerbFailed`` (with the stable
``code``, the HTTP ``status`` and the ``field``) for every other refusal.
"""

from __future__ import annotations

import builtins
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec

from infervisor.actors.ledger import LedgerView
from infervisor.adapters.spec import InstanceSpec

from .errors import ApiError, NodeStarting, NodeStopping, NodeUnavailable, NotRunning, VerbFailed
from .wire import (
    API_VERSION,
    ErrorEnvelope,
    HeartbeatAnswer,
    InstanceView,
    NodeInfo,
    PlaceAnswer,
    TokenAnswer,
    UnloadAnswer,
    VerbAnswer,
    WatchEvent,
)

__all__ = ["SOCKET_FILE", "ApiClient", "socket_path"]

#: The socket's name in the data directory (server.SOCKET_FILE; not imported from
#: there, so a client does not load the server's framework).
SOCKET_FILE = "api.sock"


def socket_path(data_dir: Path | str) -> Path:
    """The control API's socket of the node on ``data_dir``."""
    return Path(data_dir) / SOCKET_FILE


T = TypeVar("T")
_V = f"/{API_VERSION}"
_UNAVAILABLE: dict[str, type[NodeUnavailable]] = {
    "node_starting": NodeStarting,
    "node_stopping": NodeStopping,
}


class ApiClient:
    """A client of one node: ``ApiClient(data_dir=...)`` or ``ApiClient(url=..., token=...)``.

    ``timeout_s`` bounds each answer (None: as long as the node takes; it
    bounds its verbs itself). Use as a context manager, or :meth:`close`.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if (data_dir is None) == (url is None):
            raise ValueError("give data_dir or url, not both")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(timeout_s, connect=5.0)
        if data_dir is not None:
            self.where = str(data_dir)
            self.path: Path | None = socket_path(data_dir)
            transport = httpx.HTTPTransport(uds=str(self.path))
            self._http = httpx.Client(
                transport=transport,
                base_url="http://infervisor",
                headers=headers,
                timeout=timeout,
            )
        else:
            assert url is not None
            self.where = url
            self.path = None
            self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connections (idempotent)."""
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ verbs
    def node(self) -> NodeInfo:
        """The node's id, version, phase and chain head."""
        return self._call("GET", "/node", NodeInfo)

    def list(self) -> builtins.list[InstanceView]:
        """Every instance's view, ordered by id."""
        return self._call("GET", "/instances", builtins.list[InstanceView])

    def status(self, instance: str) -> InstanceView:
        """One instance's view."""
        return self._call("GET", _at(instance), InstanceView)

    def place(
        self,
        spec: InstanceSpec,
        *,
        controller: str | None = None,
        generation: int = 0,
        start: bool = False,
        idempotency_key: str | None = None,
    ) -> PlaceAnswer:
        """Place an instance (as ``controller`` at ``generation``); ``start`` starts it."""
        body = {
            "spec": msgspec.to_builtins(spec),
            "controller": controller,
            "generation": generation,
            "start": start,
        }
        return self._call("POST", "/instances", PlaceAnswer, body, idempotency_key)

    def start(
        self,
        instance: str,
        *,
        controller: str | None = None,
        idempotency_key: str | None = None,
    ) -> VerbAnswer:
        """Start the server (an operator's start resets the restart budget; a
        ``controller``'s does not, and renews its lease)."""
        return self._call(
            "POST",
            _at(instance, "start"),
            VerbAnswer,
            _by(controller),
            idempotency_key,
        )

    def stop(
        self,
        instance: str,
        grace_s: float | None = None,
        *,
        controller: str | None = None,
        idempotency_key: str | None = None,
    ) -> VerbAnswer:
        """Stop the server; answered once nothing of it is left."""
        body = _by(controller, grace_s=grace_s) if grace_s is not None else _by(controller)
        return self._call("POST", _at(instance, "stop"), VerbAnswer, body, idempotency_key)

    def restart(
        self,
        instance: str,
        *,
        controller: str | None = None,
        idempotency_key: str | None = None,
    ) -> VerbAnswer:
        """Stop (when running), then start."""
        return self._call(
            "POST",
            _at(instance, "restart"),
            VerbAnswer,
            _by(controller),
            idempotency_key,
        )

    def unload(
        self,
        instance: str,
        *,
        controller: str | None = None,
        idempotency_key: str | None = None,
    ) -> UnloadAnswer:
        """Stop the server and forget the instance."""
        return self._call(
            "POST",
            _at(instance, "unload"),
            UnloadAnswer,
            _by(controller),
            idempotency_key,
        )

    def deep_health(self, instance: str) -> str:
        """The one token the server produced."""
        return self._call("POST", _at(instance, "deep-health"), TokenAnswer).token

    def heartbeat(self, controller: str, *, idempotency_key: str | None = None) -> HeartbeatAnswer:
        """Renew ``controller``'s lease."""
        return self._call(
            "POST", "/heartbeat", HeartbeatAnswer, {"controller": controller}, idempotency_key
        )

    def ledger(self) -> LedgerView | None:
        """The memory budget and reservations (None when the node has no budget)."""
        return self._call("GET", "/ledger", LedgerView | None)  # type: ignore[arg-type]

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._send("GET", "/metrics", path_prefix="").text

    def events(self, from_seq: int | None = None, *, follow: bool = True) -> Iterator[WatchEvent]:
        """Chain events from ``from_seq`` (None: from the head on), each once, in seq order."""
        params: dict[str, Any] = {"follow": str(follow).lower()}
        if from_seq is not None:
            params["from_seq"] = from_seq
        decoder = msgspec.json.Decoder(WatchEvent)
        with self._stream("GET", f"{_V}/events", params) as response:
            data: builtins.list[str] = []
            for line in self._guarded(response.iter_lines()):
                if line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    if any(data):  # an empty data field dispatches nothing (a keep-alive)
                        yield decoder.decode("\n".join(data))
                    data = []

    def logs(
        self,
        instance: str,
        *,
        stream: str = "stderr",
        follow: bool = False,
        tail_bytes: int = 64 * 1024,
    ) -> Iterator[bytes]:
        """The server's captured output, then (``follow``) what it appends."""
        params = {"stream": stream, "follow": str(follow).lower(), "tail_bytes": tail_bytes}
        with self._stream("GET", _V + _at(instance, "logs"), params) as response:
            yield from self._guarded(response.iter_bytes())

    # ------------------------------------------------------------ plumbing
    def _call(
        self,
        method: str,
        path: str,
        type_: type[T],
        body: Any = None,
        idempotency_key: str | None = None,
    ) -> T:
        headers = {}
        if method == "POST":
            headers["idempotency-key"] = idempotency_key or uuid.uuid4().hex
        response = self._send(method, path, json=body, headers=headers)
        try:
            return msgspec.json.decode(response.content, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ApiError(f"the node's answer is not understood (another version?): {e}") from e

    def _check_socket(self) -> None:
        """NotRunning at once when the socket is missing (httpcore would leak the
        socket of a failed Unix connect)."""
        if self.path is not None and not self.path.exists():
            raise self._unreachable(httpx.ConnectError(f"{self.path}: no such socket"))

    def _send(
        self, method: str, path: str, *, path_prefix: str = _V, **kwargs: Any
    ) -> httpx.Response:
        self._check_socket()
        try:
            response = self._http.request(method, path_prefix + path, **kwargs)
        except httpx.TransportError as e:
            if method == "POST" and not isinstance(e, httpx.ConnectError):
                raise NodeStopping(
                    f"the node at {self.where} went away before answering ({e}): the verb "
                    "may have been recorded: see `infervisor status` or `infervisor watch` "
                    "once the node is back before asking again",
                    "no_answer",
                    0,
                ) from e
            raise self._unreachable(e) from e
        _raise_for(response)
        return response

    def _stream(self, method: str, path: str, params: dict[str, Any]) -> Any:
        client = self

        class _Streamed:
            def __enter__(self) -> httpx.Response:
                client._check_socket()
                try:
                    self.cm = client._http.stream(
                        method, path, params=params, timeout=httpx.Timeout(None, connect=5.0)
                    )
                    response = self.cm.__enter__()
                except httpx.TransportError as e:
                    raise client._unreachable(e) from e
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                return response

            def __exit__(self, *exc: object) -> None:
                self.cm.__exit__(None, None, None)

        return _Streamed()

    def _guarded(self, items: Iterator[T]) -> Iterator[T]:
        """``items`` of a streamed answer; the connection dropping midway is NodeStopping
        (the node went away: restarting, or shutting down)."""
        try:
            yield from items
        except httpx.TransportError as e:
            raise self._unreachable(e) from e

    def _unreachable(self, error: httpx.TransportError) -> NodeUnavailable:
        if isinstance(error, httpx.ConnectError):
            if self.path is not None:
                return NotRunning(
                    f"no node is running on {self.where} (nothing answers on {self.path}); "
                    "start one with `infervisor run CONFIG`",
                    "no_node",
                    0,
                )
            return NotRunning(f"nothing answers at {self.where}: {error}", "no_node", 0)
        if isinstance(error, httpx.TimeoutException):
            return NodeUnavailable(
                f"no answer from {self.where} in time: {error}", "node_unreachable", 0
            )
        return NodeStopping(f"the node at {self.where} went away: {error}", "node_stopping", 0)


def _by(controller: str | None, **fields: Any) -> dict[str, Any] | None:
    """A verb's body: the asking controller (none: an operator) and its other fields."""
    body = {**fields, **({"controller": controller} if controller is not None else {})}
    return body or None


def _at(instance: str, verb: str = "") -> str:
    """``/instances/ID[/VERB]``, the id quoted as one path segment (``/``, ``?``
    and ``..`` cannot leave it)."""
    path = f"/instances/{urllib.parse.quote(instance, safe='')}"
    return f"{path}/{verb}" if verb else path


def _raise_for(response: httpx.Response) -> None:
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
