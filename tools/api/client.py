"""The control API's client: what the command line and controllers use.

It finds the node through its data directory's socket
(``<data_dir>/api.sock``) or a URL with a bearer token. Every call is bounded:
connecting and each answer by ``timeout_s`` (default :data:`DEFAULT_TIMEOUT_S`),
a verb that waits on the node by ``timeout_s`` plus the node's own bound on
that verb (:data:`VERB_WAIT_S`; a stop, its grace plus 30 s). A node that is
stopped (SIGSTOP), frozen or overloaded still accepts connections on its
socket (the kernel queues them) but does not answer: that is ``NoAnswer``.
Errors are those of :mod:`.errors`: ``NotRunning`` when nothing listens,
``NoAnswer`` when nothing answers in time, ``NodeStarting``/``NodeStopping``
for 503, ``VerbFailed`` (with the stable ``code``, the HTTP ``status`` and the
``field``) for every other refusal; :mod:`.client_failures` maps them.
"""

from __future__ import annotations

import builtins
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from infervisor.adapters.spec import InstanceSpec
from infervisor.replay.views import LedgerView

from .client_failures import RequestFailures, raise_for
from .errors import ApiError
from .fleet_wire import CordonAnswer, PlacementSetAnswer
from .inventory import ModelList
from .wire import (
    API_VERSION,
    HeartbeatAnswer,
    InstanceView,
    NodeInfo,
    PlaceAnswer,
    TokenAnswer,
    UnloadAnswer,
    VerbAnswer,
    WatchEvent,
)

if TYPE_CHECKING:
    import httpx
else:
    from .lazy_httpx import httpx

__all__ = ["DEFAULT_TIMEOUT_S", "SOCKET_FILE", "VERB_WAIT_S", "ApiClient", "socket_path"]

#: The socket's name in the data directory (server.SOCKET_FILE; not imported from
#: there, so a client does not load the server's framework).
SOCKET_FILE = "api.sock"

#: Seconds to connect and for each ordinary answer, unless the caller says otherwise.
DEFAULT_TIMEOUT_S = 30.0

#: The longest a verb's own wait on the node is assumed to be when the client
#: cannot know it (the node's ``stop_grace_s``, ``deep_timeout_s``), seconds: the
#: command line's ``--grace`` at most. A node configured longer still answers in
#: time when it runs; one that stops answering is then given up on as no answer.
LONGEST_WAIT_S = 3600.0

#: Seconds a verb may take on the node beyond an ordinary answer: the node's own
#: bound on it (actors/node.py). A stop's given grace replaces the longest one.
VERB_WAIT_S: dict[str, float] = {
    "place": 120.0,  # the host's ask and the admission's (ASK_TIMEOUT_S, 60 s each)
    # the instance's ask (ASK_TIMEOUT_S), after a wait for busy instances to turn idle
    # within the kind's start-up deadline (the inference kind's cap, 900 s, by default)
    "start": 60.0 + 900.0,
    "stop": LONGEST_WAIT_S + 30.0,  # stop_grace_s plus 30 s
    "restart": LONGEST_WAIT_S + 60.0,  # stop_grace_s plus 60 s
    "unload": 120.0,  # the host's ask plus UNLOAD_WAIT_S
    "deep-health": LONGEST_WAIT_S + 5.0,  # deep_timeout_s plus 5 s
    "drain": LONGEST_WAIT_S + 30.0,  # every stop at once: stop_grace_s plus 30 s
    "placements": 120.0 + LONGEST_WAIT_S,  # admission, then unloads and starts
}

#: The longest silence of a followed event stream before it counts as no answer:
#: three of the node's keep-alives (tools/api/watch.py KEEPALIVE_S, 5 s).
STREAM_SILENCE_S = 15.0


def socket_path(data_dir: Path | str) -> Path:
    """The control API's socket of the node on ``data_dir``."""
    return Path(data_dir) / SOCKET_FILE


T = TypeVar("T")
_V = f"/{API_VERSION}"


class ApiClient:
    """A client of one node: ``ApiClient(data_dir=...)`` or ``ApiClient(url=..., token=...)``.

    ``timeout_s`` (seconds) bounds connecting and each answer; a verb that
    waits on the node gets :data:`VERB_WAIT_S` more (None: no bound at all,
    as long as the node takes). Use as a context manager, or :meth:`close`.

    Raises:
        NoAnswer: (from any call) the node accepted the request but did not
            answer within its timeout.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        if (data_dir is None) == (url is None):
            raise ValueError("give data_dir or url, not both")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self._headers = headers
        self._url = url
        self._client: httpx.Client | None = None
        if data_dir is not None:
            self.where = str(data_dir)
            self.path: Path | None = socket_path(data_dir)
        else:
            assert url is not None
            self.where = url
            self.path = None
            self._client = self._http  # made now: httpx checks the URL here, as it always did
        self._failures = RequestFailures(self.where, self.path)

    @property
    def _http(self) -> httpx.Client:
        """The HTTP client, made at the first request (it loads httpx)."""
        if self._client is None:
            from infervisor.adapters.tls import client_tls  # noqa: PLC0415 - loads httpx

            timeout = httpx.Timeout(self.timeout_s)
            if self.path is not None:
                from .uds import unix_transport  # noqa: PLC0415 - loads httpcore

                self._client = httpx.Client(
                    transport=unix_transport(str(self.path)),
                    base_url="http://infervisor",
                    headers=self._headers,
                    timeout=timeout,
                )
            else:
                assert self._url is not None
                self._client = httpx.Client(
                    base_url=self._url, headers=self._headers, timeout=timeout, verify=client_tls()
                )
        return self._client

    def close(self) -> None:
        """Close the connections (idempotent)."""
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ verbs
    def node(self) -> NodeInfo:
        """The node's id, version, phase and chain head."""
        return self._call("GET", "/node", NodeInfo)

    def models(self) -> ModelList:
        """The models of the node's registry: name, format, size and digest."""
        return self._call("GET", "/models", ModelList)

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
        return self._call("POST", "/instances", PlaceAnswer, body, idempotency_key, wait="place")

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
            wait="start",
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
        wait = VERB_WAIT_S["stop"] if grace_s is None else grace_s + 30.0  # the node's bound
        return self._call(
            "POST", _at(instance, "stop"), VerbAnswer, body, idempotency_key, wait=wait
        )

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
            wait="restart",
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
            wait="unload",
        )

    def deep_health(self, instance: str) -> str:
        """The one token the server produced."""
        return self._call(
            "POST", _at(instance, "deep-health"), TokenAnswer, wait="deep-health"
        ).token

    def heartbeat(self, controller: str, *, idempotency_key: str | None = None) -> HeartbeatAnswer:
        """Renew ``controller``'s lease."""
        return self._call(
            "POST", "/heartbeat", HeartbeatAnswer, {"controller": controller}, idempotency_key
        )

    def cordon(self, verb: str = "cordon", reason: str | None = None) -> CordonAnswer:
        """``verb`` the node: ``cordon``, ``drain`` or ``uncordon`` (``reason`` recorded)."""
        if verb not in ("cordon", "drain", "uncordon"):
            raise ValueError(f"verb {verb!r}: allowed cordon, drain, uncordon")
        body = {"reason": reason} if reason is not None else None
        wait = "drain" if verb == "drain" else 0.0
        return self._call("POST", f"/node/{verb}", CordonAnswer, body, wait=wait)

    def put_placements(
        self,
        controller: str,
        generation: int,
        placements: builtins.list[tuple[InstanceSpec, bool]],
    ) -> PlacementSetAnswer:
        """Make ``placements`` (spec, start) the whole set ``controller`` wants here."""
        body = {
            "controller": controller,
            "generation": generation,
            "placements": [
                {"spec": msgspec.to_builtins(spec), "start": start} for spec, start in placements
            ],
        }
        return self._call("PUT", "/placements", PlacementSetAnswer, body, wait="placements")

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
        silence = None if self.timeout_s is None else max(self.timeout_s, STREAM_SILENCE_S)
        with self._stream(
            "GET", f"{_V}/events", params, read_s=silence if follow else None
        ) as response:
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
        """The server's captured output, then (``follow``) what it appends.

        A followed log has no keep-alives (a quiet server writes nothing): its
        reads wait as long as it takes, once the node has answered."""
        params = {"stream": stream, "follow": str(follow).lower(), "tail_bytes": tail_bytes}
        read_s = None if follow else self.timeout_s
        with self._stream("GET", _V + _at(instance, "logs"), params, read_s=read_s) as response:
            yield from self._guarded(response.iter_bytes())

    # ------------------------------------------------------------ plumbing
    def _call(
        self,
        method: str,
        path: str,
        type_: type[T],
        body: Any = None,
        idempotency_key: str | None = None,
        *,
        wait: str | float = 0.0,
    ) -> T:
        """One request and its decoded answer; ``wait``: seconds the node may take
        beyond an ordinary answer (or the verb naming them in :data:`VERB_WAIT_S`)."""
        headers = {}
        if method == "POST":
            headers["idempotency-key"] = idempotency_key or uuid.uuid4().hex
        extra = VERB_WAIT_S[wait] if isinstance(wait, str) else wait
        timeout = None if self.timeout_s is None else self.timeout_s + extra
        response = self._send(method, path, json=body, headers=headers, timeout=timeout)
        try:
            return msgspec.json.decode(response.content, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ApiError(f"the node's answer is not understood (another version?): {e}") from e

    def _check_socket(self) -> None:
        """NotRunning at once when the socket is missing (httpcore would leak the
        socket of a failed Unix connect)."""
        if self.path is not None and not self.path.exists():
            raise self._failures.not_running()

    def _send(
        self,
        method: str,
        path: str,
        *,
        path_prefix: str = _V,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """``timeout``: seconds for the answer (None: the client's ``timeout_s``)."""
        self._check_socket()
        read_s = self.timeout_s if timeout is None else timeout
        bounds = httpx.Timeout(self.timeout_s, read=read_s)
        try:
            response = self._http.request(method, path_prefix + path, timeout=bounds, **kwargs)
        except httpx.TimeoutException as e:
            raise self._failures.no_answer(e, method, read_s) from e
        except httpx.TransportError as e:
            raise self._failures.transport(e, method) from e
        raise_for(response)
        return response

    def _stream(
        self, method: str, path: str, params: dict[str, Any], *, read_s: float | None
    ) -> Any:
        """A streamed answer: connected within ``timeout_s``; each read, the headers'
        included, within ``read_s`` (None: as long as it takes)."""
        client = self

        class _Streamed:
            def __enter__(self) -> httpx.Response:
                client._check_socket()
                bounds = httpx.Timeout(client.timeout_s, read=read_s)
                try:
                    self.cm = client._http.stream(method, path, params=params, timeout=bounds)
                    response = self.cm.__enter__()
                except httpx.TimeoutException as e:
                    waited = read_s if isinstance(e, httpx.ReadTimeout) else client.timeout_s
                    raise client._failures.no_answer(e, method, waited) from e
                except httpx.TransportError as e:
                    raise client._failures.unreachable(e) from e
                if response.status_code >= 400:
                    response.read()
                    raise_for(response)
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
            raise self._failures.unreachable(e) from e


def _by(controller: str | None, **fields: Any) -> dict[str, Any] | None:
    """A verb's body: the asking controller (none: an operator) and its other fields."""
    body = {**fields, **({"controller": controller} if controller is not None else {})}
    return body or None


def _at(instance: str, verb: str = "") -> str:
    """``/instances/ID[/VERB]``, the id quoted as one path segment (``/``, ``?``
    and ``..`` cannot leave it)."""
    path = f"/instances/{urllib.parse.quote(instance, safe='')}"
    return f"{path}/{verb}" if verb else path
