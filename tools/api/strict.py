"""Request bodies decoded strictly, before the routes see them.

Litestar converts a body leniently (``"18741"`` becomes the port 18741,
``"true"`` a boolean), as it must for query strings. A controller's body is
JSON with types: a string where a number belongs is the controller's bug, and
is answered 400 naming the field, as the command line refuses it. This ASGI
middleware decodes each POST body with msgspec in strict mode against the
route's body type (the same type the route declares, so the OpenAPI document
is unchanged) and refuses what does not decode; the body then goes on to the
app as it came.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from infervisor.adapters.spec import InstanceSpec

from .idempotency import MAX_BODY, BodyCut, read_body, replayed
from .wire import (
    API_VERSION,
    ErrorBody,
    ErrorEnvelope,
    HeartbeatRequest,
    PlaceRequest,
    StopRequest,
    VerbRequest,
)

__all__ = ["ALLOWED", "MAX_BODY", "explain", "strict_bodies"]


_V = f"/{API_VERSION}"
_ID = r"[^/]+"
#: Route pattern -> (body type, body optional).
_BODIES: tuple[tuple[re.Pattern[str], type[msgspec.Struct], bool], ...] = (
    (re.compile(rf"^{_V}/instances$"), PlaceRequest, False),
    (re.compile(rf"^{_V}/heartbeat$"), HeartbeatRequest, False),
    (re.compile(rf"^{_V}/instances/{_ID}/stop$"), StopRequest, True),
    (re.compile(rf"^{_V}/instances/{_ID}/(?:start|restart|unload)$"), VerbRequest, True),
)
_DECODERS: dict[type[msgspec.Struct], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t | None if optional else t) for _, t, optional in _BODIES
}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_NAMED = re.compile(r"^Object (?:contains unknown|missing required) field `(?P<name>[^`]*)`$")
#: The allowed values of the enum fields, for their error messages.
ALLOWED = {
    "spec.flavor": "llamacpp, mlx-lm, ollama",
    "spec.mode": "adopted, managed",
}


def explain(error: msgspec.MsgspecError, body_type: type[msgspec.Struct]) -> ErrorBody:
    """A body of ``body_type`` that does not decode: the field at fault (``spec.port``)
    and what is wrong; an unknown field is answered with the fields there are."""
    match = _AT.match(str(error))
    what = match["what"] if match else str(error)
    path = (match["path"] or "").lstrip(".") if match else ""
    path = re.sub(r"\[(\d+)\]", r".\1", path).replace("[...]", "")  # a dict value: its map
    named = _NAMED.match(what)
    if named:
        if what.startswith("Object contains unknown") and path in ("", "spec"):
            known = (InstanceSpec if path else body_type).__struct_fields__
            what += f"; allowed: {', '.join(known)}"
        path = f"{path}.{named['name']}" if path else named["name"]
    allowed = ALLOWED.get(path)
    if allowed and "allowed" not in what:
        what += f"; allowed: {allowed}"
    if isinstance(error, msgspec.DecodeError) and not path:
        what = f"the body is not valid JSON: {what}"
    missing = what.startswith("Object missing required field")
    in_spec = path.startswith("spec.") or (path == "spec" and not missing)
    code = "bad_spec" if in_spec else "bad_request"
    return ErrorBody(code=code, message=f"{path}: {what}" if path else what, field=path or None)


def _body_type(scope: dict[str, Any]) -> tuple[type[msgspec.Struct], bool] | None:
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path = scope["path"].rstrip("/") or "/"  # Litestar routes a trailing slash alike
    for pattern, body_type, optional in _BODIES:
        if pattern.match(path):
            return body_type, optional
    return None


def strict_bodies(app: Any) -> Any:
    """ASGI middleware: POST bodies decoded strictly (see the module docstring)."""

    async def middleware(scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = _body_type(scope)
        if found is None:
            await app(scope, receive, send)
            return
        body_type, optional = found
        try:
            body = await read_body(receive, limit=MAX_BODY)
        except BodyCut:
            return  # the caller is gone: nothing done, nothing to answer
        if body is None:
            await _refuse(
                send,
                413,
                ErrorBody(
                    code="too_large",
                    field=None,
                    message=f"the body is larger than {MAX_BODY} bytes",
                ),
            )
            return
        if not body.strip() and optional:
            body = b""  # no body: the route's defaults (blank space would not decode)
        else:
            try:
                _DECODERS[body_type].decode(body)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                await _refuse(send, 400, explain(e, body_type))
                return
        await app(scope, replayed(body), send)

    return middleware


async def _refuse(send: Any, status: int, error: ErrorBody) -> None:
    raw = msgspec.json.encode(ErrorEnvelope(error=error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})
