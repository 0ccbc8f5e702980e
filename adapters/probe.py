"""HTTP health probes of model servers, per flavor (synchronous httpx).

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
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from .errors import ProbeError
from .spec import Flavor

__all__ = ["MODELS_EVERY", "Health", "HealthKind", "ServerClient", "ServerReport", "deep_health"]

#: A healthy server's model list is asked on every this many probes.
MODELS_EVERY = 10

_EXCERPT = 200  # characters of a body quoted in a reason


class HealthKind(enum.StrEnum):
    """Up, still loading its model, answering wrongly, or not answering at all."""

    UP = "up"
    LOADING = "loading"
    UNHEALTHY = "unhealthy"
    UNREACHABLE = "unreachable"


class Health(msgspec.Struct, frozen=True):
    """A health verdict; ``reason`` says why when it is not up."""

    kind: HealthKind
    reason: str = ""


class ServerReport(msgspec.Struct, frozen=True):
    """One probe's result. ``models``: ids the server lists; ``resident``: models
    held in memory (Ollama only); ``flavor``: who was probed (decides how
    :meth:`lists` matches names)."""

    health: Health
    models: list[str] = msgspec.field(default_factory=list)
    version: str | None = None
    resident: list[str] = msgspec.field(default_factory=list)
    flavor: Flavor | None = None

    def lists(self, model: str) -> bool:
        """Whether the server lists ``model``: an exact id, or equal ignoring an
        Ollama ``:latest`` suffix; except for Ollama, also an id ending in
        ``/<model>``, ``/<model>.gguf`` or equal to ``<model>.gguf`` (llama.cpp
        lists the weights path when started without an alias)."""
        return any(self._matches(listed, model) for listed in self.models)

    def is_resident(self, model: str) -> bool:
        """Whether Ollama holds ``model`` in memory (``:latest`` ignored)."""
        return any(_strip_latest(r) == _strip_latest(model) for r in self.resident)

    def _matches(self, listed: str, model: str) -> bool:
        if listed == model or _strip_latest(listed) == _strip_latest(model):
            return True
        if self.flavor is Flavor.OLLAMA:
            return False
        return listed == f"{model}.gguf" or listed.endswith((f"/{model}", f"/{model}.gguf"))


def _strip_latest(name: str) -> str:
    return name.removesuffix(":latest")


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


def _excerpt(body: bytes) -> str:
    text = " ".join(body[: _EXCERPT * 4].decode("utf-8", errors="replace").split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _bad_body(reply: _Reply, limit: int) -> str | None:
    """Why a body cannot be judged (too big, not JSON), or None when it is JSON."""
    if reply.truncated:
        return f"HTTP {reply.status}: body larger than {limit} bytes"
    if _json(reply) is _NOT_JSON:
        return f"HTTP {reply.status}: not JSON: {_excerpt(reply.body)!r}"
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
    return Health(HealthKind.UNHEALTHY, f"HTTP {reply.status}: {_excerpt(reply.body)}")


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
        self._http = httpx.Client(base_url=url, timeout=timeout, trust_env=False)
        # /v1/models changes only when the server restarts; while /health stays up it is
        # asked every MODELS_EVERY probes, not on each (half the cost of a probe).
        self._models: list[str] | None = None
        self._since_models = 0

    def close(self) -> None:
        """Release the connection pool."""
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

    def _fetch_json(self, path: str) -> Any:
        """The JSON of a 200 answer, or None for any failure (used for optional lists)."""
        try:
            reply = self._fetch("GET", path)
        except ProbeError:
            return None
        if reply.status != 200 or _bad_body(reply, self._max_body) is not None:
            return None
        return _json(reply)

    def probe(self, flavor: Flavor) -> ServerReport:
        """Ask the server how it is; never raises."""
        if flavor is Flavor.OLLAMA:
            return self._probe_ollama()
        return self._probe_llamacpp(flavor)

    def _probe_llamacpp(self, flavor: Flavor) -> ServerReport:
        try:
            reply = self._fetch("GET", "/health")
        except ProbeError as e:
            return ServerReport(Health(HealthKind.UNREACHABLE, str(e)), flavor=flavor)
        health = _judge_health(reply, self._max_body)
        if health.kind is not HealthKind.UP:
            self._models = None  # ask again once it is back: it may be another server
            return ServerReport(health, flavor=flavor)
        return ServerReport(health, models=self._listed_models(), flavor=flavor)

    def _listed_models(self) -> list[str]:
        self._since_models += 1
        if self._models is None or self._since_models >= MODELS_EVERY:
            doc = self._fetch_json("/v1/models")
            self._models = _names(doc, "data", ("id",)) or _names(doc, "models", ("name", "model"))
            self._since_models = 0
        return list(self._models)

    def _probe_ollama(self) -> ServerReport:
        try:
            reply = self._fetch("GET", "/api/version")
        except ProbeError as e:
            return ServerReport(Health(HealthKind.UNREACHABLE, str(e)), flavor=Flavor.OLLAMA)
        why = _bad_body(reply, self._max_body)
        if why is None and reply.status != 200:
            why = f"HTTP {reply.status}: {_excerpt(reply.body)}"
        if why is not None:
            return ServerReport(Health(HealthKind.UNHEALTHY, why), flavor=Flavor.OLLAMA)
        doc = _json(reply)
        version = doc.get("version") if isinstance(doc, dict) else None
        return ServerReport(
            Health(HealthKind.UP),
            models=_names(self._fetch_json("/api/tags"), "models", ("name", "model")),
            version=version if isinstance(version, str) else None,
            resident=_names(self._fetch_json("/api/ps"), "models", ("name", "model")),
            flavor=Flavor.OLLAMA,
        )

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
            raise ProbeError(f"completion refused: HTTP {reply.status}: {_excerpt(reply.body)}")
        doc: Any = None if _bad_body(reply, self._max_body) else _json(reply)
        try:
            text = doc["choices"][0]["text"]
        except (TypeError, KeyError, IndexError):
            text = None
        if not isinstance(text, str):
            raise ProbeError(f"completion answer has no choices[0].text: {_excerpt(reply.body)}")
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
