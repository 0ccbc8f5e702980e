"""The control API's routes (Litestar), one actor message per verb.

Litestar is the framework: it takes msgspec Structs as bodies natively (the
node's own types, validated by msgspec on the way in) and generates the
OpenAPI 3.1 document from the same types (docs/openapi.json). Handlers are
synchronous and run on Litestar's worker threads, since each one waits for
an actor's answer; streams (watch, logs) are asynchronous on the server's loop.

Every answer that changes state is sent once the verb's events are durable
and carries the seq and hash of the instance's last event then
(:class:`~.wire.VerbAnswer`).
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio.to_thread
import msgspec
import pykka
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIType,
    Reference,
    Schema,
    SecurityScheme,
    Server,
    ServerVariable,
)
from litestar.params import HeaderParameter, JSONBody, PathParameter, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage, Stream

from infervisor.actors.errors import NodeError
from infervisor.actors.ledger import LedgerView
from infervisor.actors.node import VERSION, Node
from infervisor.adapters.proc.errors import AdapterError
from infervisor.chain.connect import connect_reader
from infervisor.replay.callers import source_for

from .auth import Caller, Peer, Tokens, authorize
from .errors import ApiError, ApiRefusal, NodeStarting, NodeStopping, answer_for
from .gate import Gate, Phase
from .idempotency import IdempotencyStore, idempotent
from .logs import STREAMS, follow_log, log_file
from .scopes import Scope, scope_for
from .strict import ALLOWED as _ALLOWED
from .strict import strict_bodies
from .watch import WatchHub, stream_events
from .wire import (
    API_VERSION,
    ErrorBody,
    ErrorEnvelope,
    HeartbeatAnswer,
    HeartbeatRequest,
    InstanceView,
    NodeInfo,
    PlaceAnswer,
    PlaceRequest,
    StopRequest,
    TokenAnswer,
    UnloadAnswer,
    VerbAnswer,
    VerbRequest,
    WatchEvent,
)

__all__ = ["ApiContext", "build_app", "openapi_document"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The largest seq a request may name (SQLite's INTEGER is 64-bit).
MAX_SEQ = 2**63 - 2
_V = f"/{API_VERSION}"


@dataclass
class ApiContext:
    """What the routes share: the gate, the chain file, who may call, the API's own port."""

    data_dir: Path
    chain_path: Path
    node_id: str
    node_uid: int
    tokens: Tokens | None = None
    api_port: int | None = None
    gate: Gate = field(default_factory=Gate)
    hub: WatchHub = field(default_factory=lambda: WatchHub(-1))
    idempotency: IdempotencyStore = field(default_factory=IdempotencyStore)
    metrics: Callable[[], tuple[bytes, str]] | None = None


# ---------------------------------------------------------------- errors
_ERRORS = {
    400: "The request or the spec is malformed: `field` names what, `message` what is allowed "
    "(a header sent twice: `field` names it).",
    401: "No bearer token, or one the node does not know (TCP); see WWW-Authenticate.",
    403: "A socket peer whose uid is neither the node's nor root's, or a token whose scope "
    "does not cover the route (the message names the scope needed and the one held).",
    404: "No such instance; the message lists the placed ones.",
    409: "The lifecycle state does not allow the verb, the port is taken, or the first "
    "request with this Idempotency-Key is still in flight.",
    422: "Admission refused (with the numbers), or an Idempotency-Key reused for another request.",
    500: "The verb was accepted and recorded, but its work failed (or the node failed).",
    413: "The body is larger than 1 MiB.",
    415: "A body that is not sent as `Content-Type: application/json`.",
    502: "The server did not produce a token (deep health check).",
    503: "The node is starting or shutting down: retry later.",
    504: "Accepted and recorded, but not done in time; it goes on.",
}

#: Every route may answer these (authentication, the node's phase, a failure).
_ALWAYS = (400, 401, 403, 500, 503)
#: Every POST may answer these too (Idempotency-Key in flight, reused).
_POSTED = (409, 413, 422)
#: A POST that takes a body may answer these too (not JSON).
_BODIED = (*_POSTED, 415)


def _responses(*statuses: int) -> dict[int, ResponseSpec]:
    return {
        s: ResponseSpec(
            data_container=ErrorEnvelope, description=_ERRORS[s], generate_examples=False
        )
        for s in sorted({*_ALWAYS, *statuses})
    }


def _text(media_type: str, description: str) -> ResponseSpec:
    """A 200 whose body is text of ``media_type`` (not JSON)."""
    return ResponseSpec(
        data_container=str,
        media_type=media_type,
        description=description,
        generate_examples=False,
    )


InstanceId = Annotated[str, PathParameter(description="The instance's id (GET /v1/instances).")]
IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        max_length=255,
        description=(
            "Makes a retry safe (draft-ietf-httpapi-idempotency-key-header): the same "
            "key with the same request gets the first answer again, with "
            "`idempotent-replayed: true`; 409 while the first is in flight; 422 for a "
            "different request. At most 255 bytes; kept in the node's memory only."
        ),
    ),
]


def _error_response(status: int, error: ErrorBody) -> Response[ErrorEnvelope]:
    return Response(ErrorEnvelope(error=error), status_code=status, media_type=MediaType.JSON)


def _on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorEnvelope]:
    status, body = answer_for(exc)
    if body.code == "node_error" and not isinstance(exc, ApiError):  # a bug: keep its traceback
        log.error("control API: %s %s failed", request.method, request.url.path, exc_info=exc)
    return _error_response(status, body)


def _on_validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorEnvelope]:
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    key = str(first.get("key") or "") or None
    if key in (None, "data"):
        key = "body"  # Litestar's name for the request body
    message = str(first.get("message") or exc.detail)
    allowed = _ALLOWED.get(key or "")
    if allowed and "allowed" not in message:
        message += f"; allowed: {allowed}"
    code = "bad_spec" if key and key.startswith("spec.") else "bad_request"
    where = f"{key}: " if key else ""
    return _error_response(400, ErrorBody(code=code, message=where + message, field=key))


def _on_http(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorEnvelope]:
    codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
    code = codes.get(exc.status_code, "bad_request")
    message = str(exc.detail)
    if exc.status_code == 404:
        message += f"; the routes are under {_V}/ (GET /schema/openapi.json lists them)"
    return _error_response(exc.status_code, ErrorBody(code=code, message=message))


# ---------------------------------------------------------------- helpers
def _identity(request: Request[Any, Any, Any]) -> str:
    return str(request.scope.get("infervisor.identity") or "")


def _source(request: Request[Any, Any, Any], role: str) -> str:
    return source_for(role, _identity(request) or None)


def _caller(node: Node, request: Request[Any, Any, Any], data: VerbRequest | None) -> str:
    """The verb's source: ``controller:…`` (and the lease renewed) when the body
    names a controller, else ``operator:…``.

    Raises:
        ApiRefusal: 403 ``forbidden``: the body names a controller and the caller
            does not hold scope control (a controller's verb renews its lease).
    """
    controller = data.controller if data is not None else None
    if controller is None:
        return _source(request, "operator")
    held = request.scope.get("infervisor.scope")
    authorize(
        Caller(identity=_identity(request), scope=held if isinstance(held, Scope) else Scope.READ),
        Scope.CONTROL,
        f"a verb naming controller {controller!r}",
    )
    node.heartbeat(controller)
    return _source(request, "controller")


def _last_of(chain_path: Path, instance_id: str | None = None) -> tuple[int, str]:
    """The seq and hash (hex) of the instance's last durable event, or of the chain's
    head (None, or an instance with no event of its own); ``(-1, "")`` on no event."""
    conn = connect_reader(str(chain_path))
    try:
        row = None
        if instance_id is not None:
            row = conn.execute(_LAST + "WHERE subject = ? " + _NEWEST, (instance_id,)).fetchone()
        if row is None:
            row = conn.execute(_LAST + _NEWEST).fetchone()
    finally:
        conn.close()
    return (int(row[0]), bytes(row[1]).hex()) if row else (-1, "")


_LAST = "SELECT seq, hash FROM events "
_NEWEST = "ORDER BY seq DESC LIMIT 1"


@contextlib.contextmanager
def _admitted(ctx: ApiContext, *, changes: bool) -> Iterator[Node]:
    """The node for one request; an actor that ended mid-verb is named."""
    with ctx.gate.admit(changes=changes) as node:
        try:
            yield node
        except pykka.ActorDeadError as e:
            if ctx.gate.phase is not Phase.OPEN:
                raise NodeStopping(
                    "the node shut down before answering", "node_stopping", 503
                ) from e
            raise ApiError(
                "the instance's actor ended during the verb (unloaded meanwhile?)",
                "invalid_state",
                409,
            ) from e


def _check_port(ctx: ApiContext, port: int) -> None:
    if ctx.api_port is not None and port == ctx.api_port:
        raise ApiError(
            f"port {port} is the node's own API port (api.tcp); choose another port",
            "port_taken",
            409,
            "spec.port",
        )


# ---------------------------------------------------------------- the app
def build_app(ctx: ApiContext) -> Litestar:  # noqa: PLR0915 - one closure per route
    """The Litestar app for ``ctx`` (authentication and idempotency are ASGI
    middleware around it: :func:`wrap`)."""

    def answer(node: Node, instance_id: str) -> VerbAnswer:
        seq, digest = _last_of(ctx.chain_path, instance_id)
        return VerbAnswer(instance=node.status(instance_id), seq=seq, hash=digest)

    @get(f"{_V}/node", sync_to_thread=True, responses=_responses())
    def node_info() -> NodeInfo:
        """The node, its phase and its chain head; 503 while it starts (a readiness check)."""
        with _admitted(ctx, changes=False) as node:
            seq, digest = _last_of(ctx.chain_path)
            health = node.append_status()
            return NodeInfo(
                node_id=ctx.node_id,
                version=VERSION,
                phase=ctx.gate.phase.value,
                head_seq=seq,
                head_hash=digest,
                instances=len(node.list()),
                lease_s=node.settings.lease_s,
                chain_writable=health.writable,
                chain_error=health.error,
                chain_failing_since_ns=health.since_ns,
                chain_append_failures=health.failures,
                containment=node.containment.mode,
                containment_reason=node.containment.reason,
                memory_cgroup=node.containment.memory,
            )

    @get(f"{_V}/instances", sync_to_thread=True, responses=_responses())
    def list_instances() -> builtins.list[InstanceView]:
        """Every instance's view, ordered by id."""
        with _admitted(ctx, changes=False) as node:
            return node.list()

    @get(f"{_V}/instances/{{instance_id:str}}", sync_to_thread=True, responses=_responses(404))
    def status(instance_id: InstanceId) -> InstanceView:
        """One instance's view."""
        with _admitted(ctx, changes=False) as node:
            return node.status(instance_id)

    @post(
        f"{_V}/instances",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_BODIED, 500, 504),
    )
    def place(
        data: JSONBody[PlaceRequest],
        request: Request[Any, Any, Any],
        idempotency_key: IdempotencyKey = None,
    ) -> PlaceAnswer:
        """Place an instance (a controller's, with its generation); with ``start``, start it.

        ``outcome`` is ``applied``, ``unchanged`` (same spec and generation:
        nothing recorded) or ``ignored`` (an older generation: recorded as
        ``instance.placement_ignored``, nothing changes).
        """
        _check_port(ctx, data.spec.port)
        role = "controller" if data.controller else "operator"
        by = _source(request, role)
        with _admitted(ctx, changes=True) as node:
            placed = node.place_outcome(
                data.spec, placed_by=data.controller, generation=data.generation, source=by
            )
            iid = placed.instance_id
            started, refused = False, None
            # Also when unchanged: a retry of a placement whose start was cut off starts it
            # (a start of a running instance records nothing).
            if data.start and placed.outcome.value != "ignored":
                try:
                    node.start(iid, by=by)
                    started = True
                except (NodeError, AdapterError) as e:
                    refused = answer_for(e)[1]  # the placement is recorded: it stands
            got = answer(node, iid)
            return PlaceAnswer(
                instance_id=iid,
                outcome=placed.outcome.value,
                generation=placed.generation,
                instance=got.instance,
                seq=got.seq,
                hash=got.hash,
                started=started,
                start_error=refused,
            )

    @post(
        f"{_V}/instances/{{instance_id:str}}/start",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_BODIED, 404, 504),
    )
    def start(
        instance_id: InstanceId,
        request: Request[Any, Any, Any],
        data: JSONBody[VerbRequest | None] = None,
        idempotency_key: IdempotencyKey = None,
    ) -> VerbAnswer:
        """Start the server (an operator start resets the restart budget; a
        controller's does not). A start of a running instance records nothing."""
        with _admitted(ctx, changes=True) as node:
            node.start(instance_id, by=_caller(node, request, data))
            return answer(node, instance_id)

    @post(
        f"{_V}/instances/{{instance_id:str}}/stop",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_BODIED, 404, 504),
    )
    def stop(
        instance_id: InstanceId,
        request: Request[Any, Any, Any],
        data: JSONBody[StopRequest | None] = None,
        idempotency_key: IdempotencyKey = None,
    ) -> VerbAnswer:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``grace_s``;
        answered once nothing of it is left."""
        grace = data.grace_s if data is not None else None
        with _admitted(ctx, changes=True) as node:
            node.stop(instance_id, grace_s=grace, by=_caller(node, request, data))
            return answer(node, instance_id)

    @post(
        f"{_V}/instances/{{instance_id:str}}/restart",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_BODIED, 404, 504),
    )
    def restart(
        instance_id: InstanceId,
        request: Request[Any, Any, Any],
        data: JSONBody[VerbRequest | None] = None,
        idempotency_key: IdempotencyKey = None,
    ) -> VerbAnswer:
        """Stop (when running), then start."""
        with _admitted(ctx, changes=True) as node:
            node.restart(instance_id, by=_caller(node, request, data))
            return answer(node, instance_id)

    @post(
        f"{_V}/instances/{{instance_id:str}}/unload",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_BODIED, 404, 504),
    )
    def unload(
        instance_id: InstanceId,
        request: Request[Any, Any, Any],
        data: JSONBody[VerbRequest | None] = None,
        idempotency_key: IdempotencyKey = None,
    ) -> UnloadAnswer:
        """Stop the server and forget the instance (answered once unloaded is durable)."""
        with _admitted(ctx, changes=True) as node:
            node.unload(instance_id, by=_caller(node, request, data))
            seq, digest = _last_of(ctx.chain_path, instance_id)
            return UnloadAnswer(instance_id=instance_id, seq=seq, hash=digest)

    @post(
        f"{_V}/instances/{{instance_id:str}}/deep-health",
        sync_to_thread=True,
        status_code=200,
        responses=_responses(*_POSTED, 404, 502, 504),
    )
    def deep_health(instance_id: InstanceId, idempotency_key: IdempotencyKey = None) -> TokenAnswer:
        """The normal probe plus one real generated token."""
        with _admitted(ctx, changes=False) as node:
            return TokenAnswer(instance_id=instance_id, token=node.deep_health(instance_id))

    @post(f"{_V}/heartbeat", sync_to_thread=True, status_code=200, responses=_responses(*_BODIED))
    def heartbeat(
        data: JSONBody[HeartbeatRequest], idempotency_key: IdempotencyKey = None
    ) -> HeartbeatAnswer:
        """Renew ``controller``'s lease (``node.lease_renewed`` is recorded at most
        once per fraction of the lease, actors/supervisor.py)."""
        with _admitted(ctx, changes=True) as node:
            node.heartbeat(data.controller)
            return HeartbeatAnswer(controller=data.controller, lease_s=node.settings.lease_s)

    @get(f"{_V}/ledger", sync_to_thread=True, responses=_responses())
    def ledger() -> LedgerView | None:
        """The memory budget and each reservation, bytes (null: the node has no budget)."""
        with _admitted(ctx, changes=False) as node:
            return node.ledger()

    @get(
        f"{_V}/events",
        responses={
            200: _text(
                "text/event-stream",
                "Server-Sent Events: `id` = seq, `event` = kind, `data` = one WatchEvent "
                "(#/components/schemas/WatchEvent) as JSON; `: keep-alive` comments while idle.",
            ),
            **_responses(),
        },
    )
    async def events(
        from_seq: Annotated[
            int | None, QueryParameter(ge=0, le=MAX_SEQ, description="First seq to send.")
        ] = None,
        follow: Annotated[bool, QueryParameter(description="Keep sending new events.")] = True,
        last_event_id: Annotated[
            str | None,
            HeaderParameter(
                name="Last-Event-ID",
                required=False,
                description="The seq of the last event seen: the stream resumes after it "
                "(from_seq wins when both are given).",
            ),
        ] = None,
    ) -> ServerSentEvent:
        """Chain events as Server-Sent Events (``id`` = seq, ``event`` = kind,
        ``data`` = :class:`WatchEvent` JSON), from ``from_seq`` or one past the
        ``Last-Event-ID`` header, else from the head on."""
        _require_open(ctx)
        start = _resume_from(last_event_id, from_seq, ctx)

        async def messages() -> AsyncIterator[ServerSentEventMessage]:
            async for item in stream_events(ctx.chain_path, ctx.hub, start, follow=follow):
                if item is None:
                    yield ServerSentEventMessage(comment="keep-alive", data=None)
                    continue
                yield ServerSentEventMessage(
                    data=msgspec.json.encode(item).decode(), event=item.kind, id=str(item.seq)
                )

        return ServerSentEvent(messages())

    @get(
        f"{_V}/instances/{{instance_id:str}}/logs",
        responses={
            200: _text("text/plain", "The captured bytes (the server's own output, as is)."),
            **_responses(404),
        },
    )
    async def logs(
        instance_id: InstanceId,
        stream: Annotated[str, QueryParameter(description="stderr or stdout")] = "stderr",
        follow: Annotated[
            bool, QueryParameter(description="Keep sending what is appended.")
        ] = False,
        tail_bytes: Annotated[
            int,
            QueryParameter(
                ge=0, le=16 * 1024 * 1024, description="Bytes of the tail to send first."
            ),
        ] = 64 * 1024,
    ) -> Stream:
        """The server's captured output: the last ``tail_bytes`` bytes of its
        current log, then (``follow``) what it appends."""
        if stream not in STREAMS:
            raise ApiError(
                f"stream {stream!r}: allowed {', '.join(STREAMS)}", "bad_value", 400, "stream"
            )
        await anyio.to_thread.run_sync(_known, ctx, instance_id)  # 404 for an unknown one
        path = log_file(ctx.data_dir, instance_id, stream)
        chunks = follow_log(path, tail_bytes=tail_bytes, follow=follow, stopped=ctx.hub)
        return Stream(chunks, media_type=MediaType.TEXT)  # Litestar adds "; charset=utf-8"

    @get(
        "/metrics",
        sync_to_thread=True,
        responses={
            200: _text(
                "text/plain",
                "Prometheus text exposition format (Content-Type names its version).",
            ),
            **{s: _responses(404)[s] for s in (401, 403, 404, 500)},
        },
    )
    def metrics() -> Response[bytes]:
        """Prometheus text exposition of the node's instances and chain."""
        if ctx.metrics is None:
            raise ApiError("metrics are not enabled on this node", "not_found", 404)
        content, content_type = ctx.metrics()
        # As given: Litestar would append a second charset to a text/* media_type.
        return Response(content, headers={"content-type": content_type})

    handlers = [
        node_info,
        list_instances,
        status,
        place,
        start,
        stop,
        restart,
        unload,
        deep_health,
        heartbeat,
        ledger,
        events,
        logs,
        metrics,
    ]
    app = Litestar(
        route_handlers=handlers,
        openapi_config=OpenAPIConfig(
            title="infervisor control API",
            version=API_VERSION,
            description=_DESCRIPTION,
            path="/schema",
            render_plugins=[],
            servers=[
                Server(
                    url="http://localhost",
                    description="The Unix socket DATA_DIR/api.sock (mode 0600; e.g. `curl "
                    "--unix-socket DATA_DIR/api.sock http://localhost/v1/node`): no token, "
                    "the kernel names the caller (SO_PEERCRED); only the node's uid and "
                    "root may call.",
                ),
                Server(
                    url="http://127.0.0.1:{port}",
                    description="The `[api] tcp` listener: every request needs a bearer token "
                    "of DATA_DIR/api-tokens.json.",
                    variables={"port": ServerVariable(default="8711")},
                ),
            ],
            security=[{"bearer": []}],
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="TCP only: `Authorization: Bearer <secret>` (one header), "
                        "a secret of DATA_DIR/api-tokens.json (0600; one per `[api] tokens` "
                        "name). Each token holds a scope, read < operate < control: each "
                        "operation's description names the one it needs (403 `forbidden` "
                        "otherwise). Requests on the Unix socket carry none and hold control.",
                    )
                }
            ),
        ),
        exception_handlers={
            ValidationException: _on_validation,
            HTTPException: _on_http,
            Exception: _on_error,
        },
        logging_config=None,
        debug=False,
    )
    _amend(app.openapi_schema)
    return app


_DESCRIPTION = (
    "The control API of one infervisor node (docs/api.md). Every verb maps to one actor "
    "message; a verb that changes state answers once its events are durable, with the seq "
    "and hash of the instance's last event. Every error is an ErrorEnvelope. POSTs take an "
    "Idempotency-Key header."
)


def _amend(doc: OpenAPI) -> None:
    """What Litestar cannot say from the handlers: the watch stream's event type, the
    verbs' optional bodies, the 401's challenge. Mutates the app's cached document, so the
    one served at /schema/openapi.json is this one too."""
    assert doc.components is not None
    assert doc.paths is not None
    schemas = doc.components.schemas
    schemas["WatchEvent"] = _struct_schema(WatchEvent)
    for route, path_item in doc.paths.items():
        for method in ("get", "post"):
            operation = getattr(path_item, method, None)
            if operation is None or operation.responses is None:
                continue
            needed = scope_for(method, route)
            operation.description = (
                f"{operation.description or ''}\n\nScope: {needed.value} (docs/api.md)."
            ).lstrip()
            answered = operation.responses.get("200")
            if method == "post" and answered is not None and not isinstance(answered, Reference):
                answered.headers = {
                    "idempotent-replayed": OpenAPIHeader(
                        schema=Schema(type=OpenAPIType.STRING, enum=["true"]),
                        description="Present on a repeat with the same Idempotency-Key: "
                        "this is the first request's answer again.",
                    )
                }
            unauthorized = operation.responses.get("401")
            if unauthorized is not None and not isinstance(unauthorized, Reference):
                unauthorized.headers = {
                    "WWW-Authenticate": OpenAPIHeader(
                        schema=Schema(type=OpenAPIType.STRING),
                        description='`Bearer realm="infervisor"` (RFC 6750).',
                        required=True,
                    )
                }
    for verb in ("start", "stop", "restart", "unload"):  # their bodies are optional
        operation = doc.paths[f"{_V}/instances/{{instance_id}}/{verb}"].post
        assert operation is not None
        assert operation.request_body is not None
        operation.request_body.required = False  # type: ignore[union-attr]
    grace = schemas["StopRequest"].properties
    assert grace is not None
    grace_s = grace["grace_s"]
    assert isinstance(grace_s, Schema)
    grace_s.minimum = 0


_SCALARS = {
    int: OpenAPIType.INTEGER,
    str: OpenAPIType.STRING,
    float: OpenAPIType.NUMBER,
    bool: OpenAPIType.BOOLEAN,
}


def _struct_schema(cls: type[msgspec.Struct]) -> Schema:
    """The schema of a flat Struct of scalars and ``dict[str, object]`` (WatchEvent)."""
    properties: dict[str, Schema | Reference] = {}
    for f in msgspec.structs.fields(cls):
        if f.type in _SCALARS:
            properties[f.encode_name] = Schema(type=_SCALARS[f.type])
        elif getattr(f.type, "__origin__", None) is dict:
            properties[f.encode_name] = Schema(type=OpenAPIType.OBJECT)
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: {f.type!r} has no schema here")
    return Schema(
        type=OpenAPIType.OBJECT,
        title=cls.__name__,
        description=inspect.cleandoc(cls.__doc__ or ""),
        properties=properties,
        required=sorted(properties),
    )


def _known(ctx: ApiContext, instance_id: str) -> None:
    """Raise as a status of ``instance_id`` would (on a worker thread: it asks an actor)."""
    with _admitted(ctx, changes=False) as node:
        node.status(instance_id)


def _require_open(ctx: ApiContext) -> Node:
    node = ctx.gate.node
    if node is None and ctx.gate.phase is Phase.STOPPING:
        raise NodeStopping("the node has shut down", "node_stopping", 503)
    if node is None:
        raise NodeStarting(
            "the node is starting (resuming from its chain); try again", "node_starting", 503
        )
    return node


def _resume_from(last: str | None, from_seq: int | None, ctx: ApiContext) -> int:
    if from_seq is not None:
        return from_seq
    if last is not None:
        if not re.fullmatch(r"[0-9]{1,18}", last.strip()):
            raise ApiError(
                f"Last-Event-ID {last!r}: expected the seq of the last event seen",
                "bad_value",
                400,
                "Last-Event-ID",
            )
        return int(last) + 1
    return _last_of(ctx.chain_path)[0] + 1


def openapi_document(app: Litestar) -> bytes:
    """The app's OpenAPI document as pretty, key-sorted JSON (docs/openapi.json)."""
    schema = msgspec.to_builtins(app.openapi_schema.to_schema())
    return msgspec.json.format(msgspec.json.encode(schema, order="sorted"), indent=2) + b"\n"


# ---------------------------------------------------------------- middleware
def wrap(app: Any, ctx: ApiContext) -> Any:
    """``app`` behind authentication (outermost), strict bodies and idempotency (ASGI)."""
    inner = strict_bodies(idempotent(app, ctx.idempotency))

    async def authenticated(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await inner(scope, receive, send)
            return
        if scope["type"] != "http":  # nothing else is served; nothing else is authenticated
            return
        try:
            caller = _authenticate(scope, ctx)
        except ApiRefusal as e:
            status, body = answer_for(e)
            raw = msgspec.json.encode(ErrorEnvelope(error=body))
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
                # a caller without credentials keeps no connection: it would hold one
                # of the listener's slots (tools/api/limits.py) for nothing
                (b"connection", b"close"),
            ]
            if status == 401:
                headers.append((b"www-authenticate", b'Bearer realm="infervisor"'))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": raw})
            return
        scope["infervisor.identity"] = caller.identity
        scope["infervisor.scope"] = caller.scope
        await inner(scope, receive, send)

    return authenticated


#: Headers a request may send at most once (lower case -> as named in an error): which
#: of two would count is a guess that the server and a proxy in front may make apart.
_ONCE = {
    b"authorization": "Authorization",
    b"content-type": "Content-Type",
    b"idempotency-key": "Idempotency-Key",
    b"last-event-id": "Last-Event-ID",
}


def _check_once(scope: dict[str, Any]) -> None:
    """Refuse a request sending one of :data:`_ONCE` twice.

    Raises:
        ApiRefusal: 400 ``bad_request`` naming the header.
    """
    names = [name for name, _ in scope.get("headers", []) if name in _ONCE]
    for name, header in _ONCE.items():
        if names.count(name) > 1:
            raise ApiRefusal(
                f"{names.count(name)} {header} headers: send exactly one",
                "bad_request",
                400,
                header,
            )


def _authenticate(scope: dict[str, Any], ctx: ApiContext) -> Caller:
    """The caller, once its scope covers the route's (tools/api/scopes.py); refuses a
    stranger (fails closed: no listener mark, a token) and a header sent twice."""
    _check_once(scope)
    given = [value for name, value in scope.get("headers", []) if name == b"authorization"]
    caller = _caller_of(scope, ctx, given[0].decode("latin-1") if given else None)
    method, path = scope["method"], scope["path"]
    authorize(caller, scope_for(method, path), f"{method} {path}")
    return caller


def _caller_of(scope: dict[str, Any], ctx: ApiContext, authorization: str | None) -> Caller:
    peer = scope.get("infervisor.peer")
    if scope.get("infervisor.listener") == "unix" and isinstance(peer, Peer):
        peer.check(ctx.node_uid)
        return Caller(identity=peer.identity, scope=Scope.CONTROL)  # the node's own user
    if ctx.tokens is None:
        raise ApiRefusal("this listener takes no requests (no tokens)", "unauthorized", 401)
    return ctx.tokens.identify(authorization)
