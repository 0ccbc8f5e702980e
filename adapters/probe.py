"""HTTP health probes of model servers, per flavor (synchronous: http.client GETs, httpx POSTs).

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` and
``reference/infer_runtime.rs.txt`` (``ServerClient::probe`` yields a
``ServerReport``: health Up, Loading, Unhealthy(reason) or Unreachable(reason),
the models the server lists and its version; ``tiny_completion`` asks for one
token as the deep health check).

llama.cpp and (for now) mlx-lm: ``GET /health`` (200 up; 503 "Loading model"
loading), then ``GET /v1/models``. Ollama: ``GET /api/version``, ``/api/tags``
and ``/api/ps``. No response body is read beyond ``max_body`` bytes, and no
httpx error leaves this module: a transport failure is an Unreachable health,
or a :class:`ProbeError` where a caller asked for a completion.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from functools import partial
from typing import Any

import httpx
import msgspec

from .errors import ProbeError, excerpt
from .http_get import GetFailed, KeepAliveGet
from .ollama_wire import RunningModel, running_models, same_model
from .spec import Flavor
from .tls import client_tls

__all__ = [
    "MODELS_EVERY",
    "Health",
    "HealthKind",
    "ProbeSteps",
    "ProbeTarget",
    "ServerClient",
    "ServerReport",
    "deep_health",
]

#: A healthy server's model list is asked on every this many probes.
MODELS_EVERY = 10


class HealthKind(enum.StrEnum):
    """Up, still loading its model, answering wrongly, or not answering at all."""

    UP = "up"
    LOADING = "loading"
    UNHEALTHY = "unhealthy"
    UNREACHABLE = "unreachable"


class Health(msgspec.Struct, frozen=True):
    """A health verdict; ``reason`` says why when it is not up.

    ``node_late_s``: seconds by which the probe's own timeout fired after it
    was due, when the probe timed out (0 otherwise). Large, it means the node
    itself did not run meanwhile (stopped, frozen, starved): the probe then
    says nothing about the server (actors/core/health.py decides so).
    """

    kind: HealthKind
    reason: str = ""
    node_late_s: float = 0.0


class ProbeTarget(msgspec.Struct, frozen=True):
    """The server a probe asks: its ``base_url`` (``http://host:port``), its
    ``flavor`` (which endpoints and how they are judged) and ``timeout_s``, the
    seconds each request of the probe may take."""

    base_url: str
    flavor: Flavor
    timeout_s: float


class ServerReport(msgspec.Struct, frozen=True):
    """One probe's result. ``models``: ids the server lists; ``resident``: models
    held in memory (Ollama only); ``flavor``: who was probed (decides how
    :meth:`lists` matches names); ``running``: Ollama's ``/api/ps`` entries, or
    None when ``/api/ps`` gave no model list (so "not listed" is never guessed)."""

    health: Health
    models: list[str] = msgspec.field(default_factory=list)
    version: str | None = None
    resident: list[str] = msgspec.field(default_factory=list)
    flavor: Flavor | None = None
    running: list[RunningModel] | None = None

    def running_model(self, model: str) -> RunningModel | None:
        """Ollama's ``/api/ps`` entry for ``model`` (``:latest`` ignored), if listed."""
        for entry in self.running or ():
            if same_model(entry.name, model):
                return entry
        return None

    def lists(self, model: str) -> bool:
        """Whether the server lists ``model``: an exact id, or equal ignoring an
        Ollama ``:latest`` suffix; except for Ollama, also an id ending in
        ``/<model>``, ``/<model>.gguf`` or equal to ``<model>.gguf`` (llama.cpp
        lists the weights path when started without an alias)."""
        return any(self._matches(listed, model) for listed in self.models)

    def is_resident(self, model: str) -> bool:
        """Whether Ollama holds ``model`` in memory (``:latest`` ignored)."""
        return any(same_model(r, model) for r in self.resident)

    def _matches(self, listed: str, model: str) -> bool:
        if listed == model or same_model(listed, model):
            return True
        if self.flavor is Flavor.OLLAMA:
            return False
        return listed == f"{model}.gguf" or listed.endswith((f"/{model}", f"/{model}.gguf"))


class _Reply(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    truncated: bool


_NOT_JSON = object()


def _json(reply: _Reply) -> Any:
    try:
        return msgspec.json.decode(reply.body)
    except msgspec.DecodeError:
        return _NOT_JSON


def _bad_body(reply: _Reply, limit: int) -> str | None:
    """Why a body cannot be judged (too big, not JSON), or None when it is JSON."""
    if reply.truncated:
        return f"HTTP {reply.status}: body larger than {limit} bytes"
    if _json(reply) is _NOT_JSON:
        return f"HTTP {reply.status}: not JSON: {excerpt(reply.body)!r}"
    return None


def _is_loading(doc: Any) -> bool:
    if not isinstance(doc, dict):
        return False
    error = doc.get("error")
    if isinstance(error, dict) and "loading model" in str(error.get("message", "")).lower():
        return True
    return "loading model" in str(doc.get("status", "")).lower()


def _judge_health(reply: _Reply, limit: int) -> Health:
    """llama.cpp ``/health``: 200 up, 503 "Loading model" loading, anything else unhealthy."""
    if (why := _bad_body(reply, limit)) is not None:
        return Health(HealthKind.UNHEALTHY, why)
    if reply.status == 200:
        return Health(HealthKind.UP)
    if reply.status == 503 and _is_loading(_json(reply)):
        return Health(HealthKind.LOADING)
    return Health(HealthKind.UNHEALTHY, f"HTTP {reply.status}: {excerpt(reply.body)}")


def _names(doc: Any, key: str, fields: tuple[str, ...]) -> list[str]:
    """Strings under ``doc[key][*][field]`` for the first field present in each item."""
    items = doc.get(key) if isinstance(doc, dict) else None
    found: list[str] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            name = next((item[f] for f in fields if isinstance(item.get(f), str)), None)
            if name is not None and name not in found:
                found.append(name)
    return found


def _get_failure(where: str, error: GetFailed, timeout: float) -> str:
    """The probe's reason for a GET that got no answer, worded as for httpx's errors."""
    if error.stage == "timeout":
        return f"{where}: no answer within {timeout} s"
    if error.stage == "connect":
        return f"{where}: cannot connect ({error})"
    return f"{where}: {error}"


class ServerClient:
    """A synchronous HTTP client for one server at ``base_url`` (``http://host:port``).

    ``timeout`` (seconds) bounds connecting and each read; ``max_body`` (bytes)
    bounds every response body read. Proxy variables from the environment are
    ignored: servers are probed directly.
    """

    def __init__(self, base_url: str, timeout: float = 2.0, *, max_body: int = 64 * 1024) -> None:
        try:
            url = httpx.URL(base_url)
        except httpx.InvalidURL as e:
            raise ProbeError(f"invalid server URL {base_url!r}: {e}") from e
        if url.scheme not in ("http", "https") or not url.host:
            raise ProbeError(f"invalid server URL {base_url!r}: expected http://host:port")
        self.base_url, self._timeout, self._max_body = base_url, timeout, max_body
        self._url = url
        # Probes (GETs) go through the light keep-alive transport; httpx is made
        # only when a completion is asked (it costs memory per instance too).
        self._get = KeepAliveGet(base_url, timeout, max_body)
        self._http: httpx.Client | None = None
        self._steps = ProbeSteps(max_body)

    def close(self) -> None:
        """Release the connections."""
        self._get.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(self, method: str, path: str, payload: Any = None) -> _Reply:
        """One request; the body is read up to ``max_body`` bytes and the rest dropped.

        Raises:
            ProbeError: connection refused, reset, timed out, or a protocol error.
        """
        where = f"{self.base_url}{path}"
        if method == "GET" and payload is None:
            try:
                got = self._get.get(path)
            except GetFailed as e:
                raise ProbeError(_get_failure(where, e, self._timeout)) from e
            return _Reply(got.status, got.body, got.truncated)
        if self._http is None:
            self._http = httpx.Client(
                base_url=self._url,
                timeout=self._timeout,
                trust_env=False,
                verify=client_tls(trust_env=False),
            )
        try:
            with self._http.stream(method, path, json=payload) as r:
                body = bytearray()
                for chunk in r.iter_bytes():
                    room = self._max_body - len(body)
                    body += chunk[:room]
                    if len(chunk) > room:  # the rest is never read: the stream is closed
                        return _Reply(r.status_code, bytes(body), truncated=True)
                return _Reply(r.status_code, bytes(body), truncated=False)
        except httpx.TimeoutException as e:
            raise ProbeError(f"{where}: no answer within {self._timeout} s") from e
        except httpx.ConnectError as e:
            raise ProbeError(f"{where}: cannot connect ({e})") from e
        except httpx.HTTPError as e:
            raise ProbeError(f"{where}: {type(e).__name__} ({e})") from e

    def probe(self, flavor: Flavor) -> ServerReport:
        """Ask the server how it is (:class:`ProbeSteps`, over this client); never raises."""
        steps = self._steps.probe(flavor)
        path = next(steps)
        while True:
            try:
                reply = self._fetch("GET", path)
            except ProbeError as e:
                step = partial(steps.throw, e)
            else:
                step = partial(steps.send, reply)
            try:
                path = step()
            except StopIteration as done:
                report: ServerReport = done.value
                return report

    def complete(self, model: str | None, prompt: str, max_tokens: int) -> str:
        """``POST /v1/completions`` (OpenAI form) and return ``choices[0].text``.

        Blocks up to the client's timeout per read; ``model`` None lets the
        server choose.

        Raises:
            ProbeError: unreachable, a status other than 200, or an answer
                without ``choices[0].text``; the message says which.
        """
        payload: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "stream": False}
        if model is not None:
            payload["model"] = model
        reply = self._fetch("POST", "/v1/completions", payload)
        if reply.status != 200:
            raise ProbeError(f"completion refused: HTTP {reply.status}: {excerpt(reply.body)}")
        doc: Any = None if _bad_body(reply, self._max_body) else _json(reply)
        try:
            text = doc["choices"][0]["text"]
        except (TypeError, KeyError, IndexError):
            text = None
        if not isinstance(text, str):
            raise ProbeError(f"completion answer has no choices[0].text: {excerpt(reply.body)}")
        return text

    def tiny_completion(self, model: str | None) -> str:
        """Ask for one token (the deep health check) and return it.

        Raises:
            ProbeError: with the reason the completion failed.
        """
        return self.complete(model, "Hello", 1)


def deep_health(
    base_url: str, flavor: Flavor, timeout: float, model: Callable[[ServerReport], str | None]
) -> str:
    """The normal probe plus one real token (``reference/infer_runtime.rs.txt``
    ``deep_health``: "a tiny completion succeeds"). ``model`` picks the model to
    ask from the report (None lets the server choose). ``timeout`` in seconds
    bounds each request: a cold model can take minutes for its first token.

    Returns:
        The token.

    Raises:
        ProbeError: the server is not up, or gave no token; the message says which.
    """
    with ServerClient(base_url, timeout) as client:
        report = client.probe(flavor)
        if report.health.kind is not HealthKind.UP:
            raise ProbeError(f"deep health: {report.health.kind}: {report.health.reason}")
        return client.tiny_completion(model(report))


# ---------------------------------------------------------------- the probe, without I/O
# One probe of a server is a few GETs whose answers decide the next request and
# the verdict. ProbeSteps.probe is a generator that yields each path to GET and
# is sent the reply (or thrown the ProbeError of a request that got no answer);
# it returns the ServerReport. ServerClient (above) and the node's ProbeEngine
# (probe_engine.py) drive the same steps over their own transports, so both
# judge a server alike.

#: What :meth:`ProbeSteps.probe` is: yields paths, is sent replies, returns the report.
Steps = Generator[str, _Reply, ServerReport]


class ProbeSteps:
    """The probe of one server, with what it remembers between probes (the model
    list of a server that stays up). ``max_body``: bytes of a body judged."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        # /v1/models changes only when the server restarts; while /health stays up it
        # is asked every MODELS_EVERY probes, not on each (half the cost of a probe).
        self._models: list[str] | None = None
        self._since_models = 0

    def probe(self, flavor: Flavor) -> Steps:
        """The steps of one probe of a ``flavor`` server."""
        if flavor is Flavor.OLLAMA:
            return self._ollama()
        return self._llamacpp(flavor)

    def _llamacpp(self, flavor: Flavor) -> Steps:
        try:
            reply = yield "/health"
        except ProbeError as e:
            return ServerReport(Health(HealthKind.UNREACHABLE, str(e)), flavor=flavor)
        health = _judge_health(reply, self.max_body)
        if health.kind is not HealthKind.UP:
            self._models = None  # ask again once it is back: it may be another server
            return ServerReport(health, flavor=flavor)
        self._since_models += 1
        if self._models is None or self._since_models >= MODELS_EVERY:
            doc = yield from self._optional("/v1/models")
            self._models = _names(doc, "data", ("id",)) or _names(doc, "models", ("name", "model"))
            self._since_models = 0
        return ServerReport(health, models=list(self._models), flavor=flavor)

    def _ollama(self) -> Steps:
        try:
            reply = yield "/api/version"
        except ProbeError as e:
            return ServerReport(Health(HealthKind.UNREACHABLE, str(e)), flavor=Flavor.OLLAMA)
        why = _bad_body(reply, self.max_body)
        if why is None and reply.status != 200:
            why = f"HTTP {reply.status}: {excerpt(reply.body)}"
        if why is not None:
            return ServerReport(Health(HealthKind.UNHEALTHY, why), flavor=Flavor.OLLAMA)
        doc = _json(reply)
        version = doc.get("version") if isinstance(doc, dict) else None
        tags = yield from self._optional("/api/tags")
        ps = yield from self._optional("/api/ps")
        return ServerReport(
            Health(HealthKind.UP),
            models=_names(tags, "models", ("name", "model")),
            version=version if isinstance(version, str) else None,
            resident=_names(ps, "models", ("name", "model")),
            flavor=Flavor.OLLAMA,
            running=running_models(ps),
        )

    def _optional(self, path: str) -> Generator[str, _Reply, Any]:
        """The JSON of a 200 answer to ``GET path``, or None for any failure."""
        try:
            reply = yield path
        except ProbeError:
            return None
        if reply.status != 200 or _bad_body(reply, self.max_body) is not None:
            return None
        return _json(reply)
