"""The front's ASGI app: one OpenAI-compatible endpoint for the node's instances.

Raw ASGI, not a framework: the proxied routes are the hot path (time to first
token), and what they need is a bearer check, one field of the body and a
byte pipe; a framework's routing, validation and response classes added
about as much per request as the whole proxy does (commit message: the
measurements). Routes (docs/front.md):

- ``GET /v1/models``: every placed instance with its residency (OpenAI's list
  shape; ``id`` is the instance id, which routes to that one instance; the extra
  fields give the served model name, the role and the instance's state);
  ``GET /v1/models/{model}`` the entry a ``model`` routes to;
- ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``:
  routed by ``model`` (:mod:`.routes`), forwarded (:mod:`.proxy`);
- Ollama's ``POST /api/chat``, ``/api/generate``, ``/api/embed``,
  ``/api/embeddings``, ``/api/show`` to Ollama instances by ``model``, and
  ``GET /api/tags``, ``/api/ps`` merged over the node's Ollama servers (only
  the models the node has instances for).

Every request needs ``Authorization: Bearer <secret>`` of one of the control
API's tokens (``<data_dir>/api-tokens.json``); the GET routes (what only looks)
take any scope, the POST routes (inference, which may start and evict
instances: residency) ``infer`` (:data:`INFERENCE_SCOPE`); a refusal is
answered in OpenAI's error shape (:mod:`.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import msgspec

from infervisor.replay.callers import source_for

from ..api.errors import ApiRefusal
from ..api.scopes import SCOPE_ORDER, Scope
from ..netkit.framing import body_too_large
from .bodies import ROUTES, parse
from .errors import FrontError, retry_after
from .proxy import Proxy, Receive, Send, until_disconnect
from .routes import READY, Route
from .upstream import UpstreamError

if TYPE_CHECKING:
    from ..api.auth import Caller, Tokens

__all__ = ["MAX_BODY_BYTES", "FrontApp"]

#: The largest request body taken, bytes (a chat with images inlined as base64).
MAX_BODY_BYTES = 64 << 20
#: The role of a request's source in the events it causes (``front:<caller>``).
REQUEST_ROLE = "front"
_GETS = ("/v1/models", "/api/tags", "/api/ps")
_ONE_MODEL = "/v1/models/"
_JSON = [(b"content-type", b"application/json")]
#: The scope a POST route (inference) needs: a request may start an instance and
#: evict others for it by the residency policy, and makes a server generate;
#: ``read`` only looks, and ``infer`` takes no verb of the control API.
INFERENCE_SCOPE = Scope.INFER


class FrontApp:
    """The ASGI app; :attr:`proxy` is None until the node is open (503 meanwhile).

    The connection limit is the server's, not the app's (:mod:`.connection`).
    """

    def __init__(self, tokens: Tokens, node_id: str) -> None:
        self.tokens = tokens
        self.node_id = node_id
        self.proxy: Proxy | None = None
        self.stopping = False

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no lifespan, no WebSocket
        try:
            await self._handle(scope, receive, send)
        except FrontError as e:
            if self.proxy is not None:
                self.proxy.tally.refuse(e.code)
            await _error(send, e)
        except _ClientGone:
            return  # nobody to answer

    async def _handle(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        caller = self._caller(scope)
        proxy = self._proxy()
        path, method = scope["path"], scope["method"]
        if path in _GETS:
            _allow(method, "GET", path)
            if path == "/v1/models":
                await _json(send, 200, await self._models(proxy))
            else:
                await _json(send, 200, await _ollama_lists(proxy, path))
            return
        if path.startswith(_ONE_MODEL):
            _allow(method, "GET", path)
            await _json(send, 200, await self._one_model(proxy, path.removeprefix(_ONE_MODEL)))
            return
        if path not in ROUTES:
            raise FrontError(
                404,
                f"no route {path}; routes: GET {', GET '.join(_GETS)}, GET /v1/models/ID, "
                f"POST {', POST '.join(ROUTES)}",
                "unknown_route",
            )
        _allow(method, "POST", path)
        _permit(caller, path)
        body = await _body(receive, path)
        asked = parse(path, body)
        by = source_for(REQUEST_ROLE, caller.identity)
        work = asyncio.ensure_future(proxy.serve(scope, send, asked=asked, body=body, by=by))
        gone = asyncio.ensure_future(until_disconnect(receive))
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            gone.cancel()
            work.result()  # a FrontError before the answer began is answered above
            return
        work.cancel()  # the client went away: closing the upstream request ends it
        with contextlib.suppress(asyncio.CancelledError, FrontError):
            await work

    def _caller(self, scope: dict[str, Any]) -> Caller:
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given) > 1:
            raise FrontError(
                400, "send exactly one Authorization header", "bad_request", param="Authorization"
            )
        try:
            caller = self.tokens.identify(given[0].decode("latin-1") if given else None)
        except ApiRefusal as e:
            raise FrontError(
                401,
                f"{e}; the front takes the node's API tokens",
                "invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="infervisor"'},
            ) from None
        return caller

    def _proxy(self) -> Proxy:
        if self.stopping:
            raise FrontError(
                503,
                "the node is stopping",
                "node_stopping",
                headers={"Retry-After": retry_after(5)},
            )
        if self.proxy is None:
            raise FrontError(
                503,
                "the node is starting: retry shortly",
                "node_starting",
                headers={"Retry-After": retry_after(1)},
            )
        return self.proxy

    async def _models(self, proxy: Proxy) -> dict[str, Any]:
        table = await proxy.table(fresh=True)
        return {"object": "list", "data": [self._model(r) for r in table.routes]}

    async def _one_model(self, proxy: Proxy, model: str) -> dict[str, Any]:
        """``GET /v1/models/{model}`` (OpenAI's retrieve): the entry of the instance
        ``model`` routes to (an instance id, a served name or a role).

        Raises:
            FrontError: 404 ``model_not_found`` naming the models there are.
        """
        table = await proxy.table(fresh=True)
        found = table.find(model)
        if found is None:
            raise table.refuse_unknown(model)
        return self._model(found)

    def _model(self, route: Route) -> dict[str, Any]:
        v = route.view
        entry: dict[str, Any] = {
            "id": v.instance_id,
            "object": "model",
            "created": v.since_ns // 1_000_000_000,
            "owned_by": self.node_id,
            "instance_id": v.instance_id,
            "served_name": route.served,
            "role": v.role,
            "flavor": v.flavor,
            "mode": v.mode,
            "names": [v.instance_id, *route.names],
            "lifecycle": v.lifecycle,
            "residency": residency_of(v.lifecycle, v.resting),
            "on_demand": v.on_demand,
            "idle_ttl_s": v.idle_ttl_s,
            "priority": v.priority,
            "pinned": v.pinned,
            "last_use_ns": v.last_use_ns,
            "busy": v.busy,
            "reserved_bytes": v.reserved_bytes,
        }
        return entry


class _ClientGone(Exception):
    """The client went away while sending its request."""


def residency_of(lifecycle: str, resting: bool) -> str:
    """``resident`` (running), ``loading``, ``resting`` (started on demand),
    ``stopped`` (by an operator or controller), else the lifecycle state."""
    if resting or lifecycle == "resting":
        return "resting"
    if lifecycle == READY:
        return "resident"
    if lifecycle in ("starting", "restarting"):
        return "loading"
    return lifecycle


async def _ollama_lists(proxy: Proxy, path: str) -> dict[str, Any]:
    """``/api/tags`` or ``/api/ps`` of every Ollama server the node routes to, merged,
    with only the models it has instances for; an unreachable server adds none."""
    table = await proxy.table()
    servers: dict[str, set[str]] = {}
    for route in table.routes:
        if route.ollama:
            servers.setdefault(route.base_url, set()).update(route.names)

    async def one(base: str, names: set[str]) -> list[Any]:
        try:
            answer = await proxy.upstreams.get_json(base, path)
        except UpstreamError:  # unreachable
            return []
        models = answer.get("models", []) if isinstance(answer, dict) else []  # Ollama's?
        if not isinstance(models, list):
            return []
        return [m for m in models if isinstance(m, dict) and m.get("name", m.get("model")) in names]

    found = await asyncio.gather(*(one(b, n) for b, n in sorted(servers.items())))
    return {"models": [m for models in found for m in models]}


def _permit(caller: Caller, path: str) -> None:
    """Refuse an inference request of a token whose scope does not cover
    :data:`INFERENCE_SCOPE`, before its body is read (nothing is demanded,
    nothing recorded), as the control API refuses a route beyond a scope.

    Raises:
        FrontError: 403 ``forbidden`` (``permission_error``) naming the scope needed
            and the one held.
    """
    if caller.scope.covers(INFERENCE_SCOPE):
        return
    raise FrontError(
        403,
        f"POST {path} needs scope {INFERENCE_SCOPE.value}; {caller.identity} holds "
        f"{caller.scope.value}: a request through the front may start an instance and "
        f"evict others (scopes: {SCOPE_ORDER}; a token's "
        "scope is set in the node's [api] tokens)",
        "forbidden",
    )


def _allow(method: str, allowed: str, path: str) -> None:
    if method != allowed:
        raise FrontError(405, f"{path} takes {allowed}, not {method}", "method_not_allowed")


async def _body(receive: Receive, path: str) -> bytes:
    """The whole request body (at most :data:`MAX_BODY_BYTES`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:  # the connection refuses it first (tools/netkit/framing.py)
            over = body_too_large(MAX_BODY_BYTES)
            raise FrontError(over.status, f"{path}: {over.message}", over.code, param=over.field)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _json(send: Send, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
    raw = msgspec.json.encode(doc)
    head = [*_JSON, (b"content-length", str(len(raw)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw, "more_body": False})


async def _error(send: Send, e: FrontError) -> None:
    raw = e.body()
    head = [*_JSON, (b"content-length", str(len(raw)).encode())]
    head += [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    await send({"type": "http.response.start", "status": e.status, "headers": head})
    await send({"type": "http.response.body", "body": raw, "more_body": False})
