"""The ASGI middleware around the control API's app: authentication (outermost),
then strict bodies (tools/api/strict.py) and idempotency (tools/api/idempotency.py).

A caller is known before anything else is looked at: the Unix socket's peer
by SO_PEERCRED, a TCP caller by its bearer token (RFC 6750); its scope must
cover the route's (tools/api/scopes.py). A refusal here is answered directly,
in the API's one error shape, and the connection closed. A request for no route
is answered here too, once its caller is known (a stranger gets 401 first and
learns nothing of which routes exist): 404 ``not_found``, or 405
``method_not_allowed`` with ``Allow`` where the path takes other methods,
whatever the caller's scope; the connection stays open.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .answers import answer_for
from .auth import Caller, Peer, authorize
from .context import ApiContext
from .errors import ApiRefusal
from .idempotency import idempotent
from .scopes import Scope, methods_for, scope_for
from .strict import strict_bodies
from .wire import API_VERSION, ErrorEnvelope

__all__ = ["NoRoute", "wrap"]


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
            await _answer(send, e)
            return
        scope["infervisor.identity"] = caller.identity
        scope["infervisor.scope"] = caller.scope
        scope["infervisor.credential"] = caller.credential or caller.identity
        await inner(scope, receive, send)

    return authenticated


class NoRoute(ApiRefusal):
    """A request for no route of the API: 404, or 405 naming the methods ``allow``."""

    def __init__(self, method: str, path: str, allow: tuple[str, ...]) -> None:
        if allow:
            message = f"{path} takes {', '.join(allow)}, not {method}"
            super().__init__(message, "method_not_allowed", 405)
        else:
            message = (
                f"no route {method} {path}; the routes are under /{API_VERSION}/ "
                "(GET /schema/openapi.json lists them)"
            )
            super().__init__(message, "not_found", 404)
        self.allow = allow


async def _answer(send: Any, refusal: ApiRefusal) -> None:
    """Answer ``refusal`` in the API's error shape; the connection is closed unless
    the request was for no route (its caller is known: it may keep it)."""
    status, body = answer_for(refusal)
    raw = msgspec.json.encode(ErrorEnvelope(error=body))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if isinstance(refusal, NoRoute):
        if refusal.allow:
            headers.append((b"allow", ", ".join(refusal.allow).encode()))
    else:
        # a caller without credentials keeps no connection: it would hold one of the
        # listener's slots (tools/api/limits.py) for nothing
        headers.append((b"connection", b"close"))
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="infervisor"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


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
    stranger (fails closed: no listener mark, a token), a header sent twice, and
    then a request for no route (:class:`NoRoute`, whatever the caller's scope)."""
    _check_once(scope)
    given = [value for name, value in scope.get("headers", []) if name == b"authorization"]
    caller = _caller_of(scope, ctx, given[0].decode("latin-1") if given else None)
    method, path = scope["method"], scope["path"]
    needed = scope_for(method, path)
    if needed is None:
        raise NoRoute(method, path, methods_for(path))
    authorize(caller, needed, f"{method} {path}")
    return caller


def _caller_of(scope: dict[str, Any], ctx: ApiContext, authorization: str | None) -> Caller:
    peer = scope.get("infervisor.peer")
    if scope.get("infervisor.listener") == "unix" and isinstance(peer, Peer):
        peer.check(ctx.node_uid)
        return Caller(identity=peer.identity, scope=Scope.CONTROL)  # the node's own user
    if ctx.tokens is None:
        raise ApiRefusal("this listener takes no requests (no tokens)", "unauthorized", 401)
    return ctx.tokens.identify(authorization)
