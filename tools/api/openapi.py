"""The control API's OpenAPI 3.1 document (docs/openapi.json): what each route
may answer, and what Litestar cannot say from the route handlers.

Litestar generates the document from the controllers (tools/api/serving/);
:func:`responses` gives each operation its documented error statuses, all of
one shape (:class:`~.wire.ErrorEnvelope`); :func:`amend` adds the scope of
each operation, the headers and the schemas the handlers do not declare.
"""

from __future__ import annotations

import inspect

import msgspec
from litestar import Litestar
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIHeader,
    OpenAPIType,
    Reference,
    Responses,
    Schema,
    SecurityScheme,
    Server,
    ServerVariable,
)

from .scopes import scope_for
from .wire import API_VERSION, ErrorEnvelope, WatchEvent

__all__ = [
    "BODIED",
    "POSTED",
    "amend",
    "openapi_config",
    "openapi_document",
    "responses",
    "text",
]

_ERRORS = {
    400: "The request or the spec is malformed: `field` names what, `message` what is allowed "
    "(a header sent twice: `field` names it).",
    401: "No bearer token, or one the node does not know (TCP); see WWW-Authenticate.",
    403: "A socket peer whose uid is neither the node's nor root's, or a token whose scope "
    "does not cover the route (the message names the scope needed and the one held).",
    404: "No such instance; the message lists the placed ones.",
    409: "The lifecycle state does not allow the verb, the port is taken, the first "
    "request with this Idempotency-Key is still in flight, the node is cordoned (`cordoned`), "
    "or a placement set is older than the controller's last (`stale_generation`).",
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
POSTED = (409, 413, 422)
#: A POST that takes a body may answer these too (not JSON).
BODIED = (*POSTED, 415)


def responses(*statuses: int) -> dict[int, ResponseSpec]:
    """The error answers of a route: ``statuses`` and those every route may give."""
    return {
        s: ResponseSpec(
            data_container=ErrorEnvelope, description=_ERRORS[s], generate_examples=False
        )
        for s in sorted({*_ALWAYS, *statuses})
    }


def text(media_type: str, description: str) -> ResponseSpec:
    """A 200 whose body is text of ``media_type`` (not JSON)."""
    return ResponseSpec(
        data_container=str,
        media_type=media_type,
        description=description,
        generate_examples=False,
    )


_DESCRIPTION = (
    "The control API of one infervisor node (docs/api.md). Every verb maps to one actor "
    "message; a verb that changes state answers once its events are durable, with the seq "
    "and hash of the instance's last event. Every error is an ErrorEnvelope. POSTs take an "
    "Idempotency-Key header."
)

_UNIX = Server(
    url="http://localhost",
    description="The Unix socket DATA_DIR/api.sock (mode 0600; e.g. `curl "
    "--unix-socket DATA_DIR/api.sock http://localhost/v1/node`): no token, "
    "the kernel names the caller (SO_PEERCRED); only the node's uid and "
    "root may call.",
)
_TCP = Server(
    url="http://127.0.0.1:{port}",
    description="The `[api] tcp` listener: every request needs a bearer token "
    "of DATA_DIR/api-tokens.json.",
    variables={"port": ServerVariable(default="8711")},
)
_BEARER = SecurityScheme(
    type="http",
    scheme="bearer",
    description="TCP only: `Authorization: Bearer <secret>` (one header), "
    "a secret of DATA_DIR/api-tokens.json (0600; one per `[api] tokens` "
    "name). Each token holds a scope, read < infer < operate < control: each "
    "operation's description names the one it needs (403 `forbidden` "
    "otherwise). Requests on the Unix socket carry none and hold control.",
)


def openapi_config() -> OpenAPIConfig:
    """The document's header: title, servers, security; served at /schema/openapi.json."""
    return OpenAPIConfig(
        title="infervisor control API",
        version=API_VERSION,
        description=_DESCRIPTION,
        path="/schema",
        render_plugins=[],
        servers=[_UNIX, _TCP],
        security=[{"bearer": []}],
        components=Components(security_schemes={"bearer": _BEARER}),
    )


def amend(doc: OpenAPI) -> None:
    """What Litestar cannot say from the handlers: the watch stream's event type, the
    verbs' optional bodies, the 401's challenge. Mutates the app's cached document, so the
    one served at /schema/openapi.json is this one too."""
    assert doc.components is not None
    assert doc.paths is not None
    schemas = doc.components.schemas
    schemas["WatchEvent"] = _struct_schema(WatchEvent)
    for route, path_item in doc.paths.items():
        for method in ("get", "post", "put"):
            operation = getattr(path_item, method, None)
            if operation is None or operation.responses is None:
                continue
            needed = scope_for(method, route)
            assert needed is not None, f"{method} {route}: no row in ROUTE_SCOPES"
            operation.description = (
                f"{operation.description or ''}\n\nScope: {needed.value} (docs/api.md)."
            ).lstrip()
            _headers(method, operation.responses)
    verbs = [f"instances/{{instance_id}}/{v}" for v in ("start", "stop", "restart", "unload")]
    for verb in (*verbs, "node/cordon", "node/drain", "node/uncordon"):  # optional bodies
        operation = doc.paths[f"/{API_VERSION}/{verb}"].post
        assert operation is not None
        assert operation.request_body is not None
        operation.request_body.required = False  # type: ignore[union-attr]
    grace = schemas["StopRequest"].properties
    assert grace is not None
    grace_s = grace["grace_s"]
    assert isinstance(grace_s, Schema)
    grace_s.minimum = 0


def _headers(method: str, answers: Responses) -> None:
    """The replay mark of a POST's 200 and the challenge of a 401."""
    answered = answers.get("200")
    if method == "post" and answered is not None and not isinstance(answered, Reference):
        answered.headers = {
            "idempotent-replayed": OpenAPIHeader(
                schema=Schema(type=OpenAPIType.STRING, enum=["true"]),
                description="Present on a repeat with the same Idempotency-Key: "
                "this is the first request's answer again.",
            )
        }
    unauthorized = answers.get("401")
    if unauthorized is not None and not isinstance(unauthorized, Reference):
        unauthorized.headers = {
            "WWW-Authenticate": OpenAPIHeader(
                schema=Schema(type=OpenAPIType.STRING),
                description='`Bearer realm="infervisor"` (RFC 6750).',
                required=True,
            )
        }


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


def openapi_document(app: Litestar) -> bytes:
    """The app's OpenAPI document as pretty, key-sorted JSON (docs/openapi.json)."""
    schema = msgspec.to_builtins(app.openapi_schema.to_schema())
    return msgspec.json.format(msgspec.json.encode(schema, order="sorted"), indent=2) + b"\n"
