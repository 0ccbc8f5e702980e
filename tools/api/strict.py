"""Request bodies decoded strictly, before the routes see them.

Litestar converts a body leniently (``"18741"`` becomes the port 18741,
``"true"`` a boolean), as it must for query strings. A controller's body is
JSON with types: a string where a number belongs is the controller's bug, and
is answered 400 naming the field, as the command line refuses it. This ASGI
middleware decodes each POST (and PUT) body with msgspec in strict mode against the
route's body type (the same type the route declares, so the OpenAPI document
is unchanged) and refuses what does not decode; the body then goes on to the
app as it came.

It also refuses, before anything is done:

- a body not sent as ``Content-Type: application/json`` (415; a POST with no
  body where the body is optional is fine without one);
- a body nested deeper than :data:`MAX_DEPTH` levels (400 ``body``: msgspec
  would otherwise recurse until a ``RecursionError``);
- an integer outside the chain's 64-bit range anywhere in the body (400
  naming it): the chain's canonical form holds exact 64-bit integers
  (docs/chain-format.md), so such a number could be accepted but not recorded.

Every refusal names its ``field``: the body field at fault, ``body`` for the
body as a whole, ``Content-Type`` for its media type.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from infervisor.adapters.spec import NUMBER_RANGES, InstanceSpec
from infervisor.replay.policy import RESTART_RANGES

from .exit_codes import cut
from .fleet_wire import CordonRequest, PlacementSet
from .idempotency import MAX_BODY, TOO_LARGE, BodyCut, read_body, replayed
from .json_keys import duplicated_key
from .json_words import malformed, not_an_object
from .one_line import ALLOWED as ONE_LINE
from .one_line import refusal
from .wire import (
    API_VERSION,
    INT64_MAX,
    ErrorBody,
    ErrorEnvelope,
    HeartbeatRequest,
    PlaceRequest,
    StopRequest,
    VerbRequest,
)

__all__ = ["ALLOWED", "INT64", "MAX_BODY", "MAX_DEPTH", "explain", "strict_bodies"]

#: The integers the chain's canonical form holds (docs/chain-format.md).
INT64 = (-INT64_MAX - 1, INT64_MAX)
#: Deepest nesting of arrays and objects a body may have (a placement needs 3).
MAX_DEPTH = 16
#: The media type of every body.
JSON = "application/json"
#: Names the body as a whole in an error's ``field``.
BODY = "body"


_V = f"/{API_VERSION}"
_ID = r"[^/]+"
#: Route pattern -> (body type, body optional).
_BODIES: tuple[tuple[re.Pattern[str], type[msgspec.Struct], bool], ...] = (
    (re.compile(rf"^{_V}/instances$"), PlaceRequest, False),
    (re.compile(rf"^{_V}/heartbeat$"), HeartbeatRequest, False),
    (re.compile(rf"^{_V}/instances/{_ID}/stop$"), StopRequest, True),
    (re.compile(rf"^{_V}/instances/{_ID}/(?:start|restart|unload)$"), VerbRequest, True),
    (re.compile(rf"^{_V}/node/(?:cordon|drain|uncordon)$"), CordonRequest, True),
    (re.compile(rf"^{_V}/placements$"), PlacementSet, False),
)
#: An item of a placement set, as a field names it (``placements[2].spec.model``).
_ITEM = re.compile(r"^placements\[\d+\]\.")
_DECODERS: dict[type[msgspec.Struct], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t | None if optional else t) for _, t, optional in _BODIES
}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_NAMED = re.compile(r"^Object (?:contains unknown|missing required) field `(?P<name>[^`]*)`$")
_NAME = "a plain name: letters, digits, '.', '_', '-', at most 64, no leading punctuation"
#: The allowed values of fields whose msgspec message does not say them.
ALLOWED = {
    "spec.flavor": "llamacpp, mlx-lm, ollama",
    "spec.mode": "adopted, managed",
    "controller": _NAME,
    "generation": "0 to 2^63-1",
    "grace_s": "0 to 3600 seconds",
    "reason": ONE_LINE,
    **{f"spec.{name}": allowed for name, allowed in NUMBER_RANGES.items()},
    **{f"spec.restart.{name}": allowed for name, allowed in RESTART_RANGES.items()},
}


def explain(
    error: msgspec.MsgspecError, body_type: type[msgspec.Struct], body: bytes = b"{}"
) -> ErrorBody:
    """A ``body`` of ``body_type`` that does not decode: the field at fault (``spec.port``)
    and what is wrong; an unknown field is answered with the fields there are; a body
    that is not JSON, or not an object, in the words of :mod:`.json_words`."""
    if not isinstance(error, msgspec.ValidationError):  # (a ValidationError is a DecodeError)
        return _named(BODY, malformed(error, body), in_spec=False)
    match = _AT.match(str(error))
    what = match["what"] if match else str(error)
    path = (match["path"] or "").lstrip(".") if match else ""
    item = _ITEM.match(path)  # a set's item keeps its index as the body writes it
    prefix = item[0] if item else ""
    path = path[len(prefix) :]
    path = re.sub(r"\[(\d+)\]", r".\1", path).replace("[...]", "")  # a dict value: its map
    named = _NAMED.match(what)
    if named:
        if what.startswith("Object contains unknown") and path in ("", "spec"):
            known = (InstanceSpec if path else body_type).__struct_fields__
            what += f"; allowed: {', '.join(known)}"
        path = f"{path}.{named['name']}" if path else named["name"]
    allowed = ALLOWED.get(path)
    if allowed and what.startswith("Expected `str` matching regex"):
        # the pattern itself says nothing to a reader: what is allowed does, and for
        # a reason which character is not (stop 34's trial: U+200B, unnamed)
        why = _reason_refusal(body) if path == "reason" else None
        what = "refused" if why is None else f"{why}; allowed: {allowed}"
    if allowed and "allowed" not in what:
        what += f"; allowed: {allowed}"
    if not path and (whole := not_an_object(error)) is not None:
        what = whole
    missing = what.startswith("Object missing required field")
    in_spec = path.startswith("spec.") or (path == "spec" and not missing)
    return _named((prefix + path).rstrip(".") or BODY, what, in_spec=in_spec)


def _reason_refusal(body: bytes) -> str | None:
    """Why the body's top-level ``reason`` breaks the one-line rule, in
    :func:`.one_line.refusal`'s words (decoded again: only a refused body pays)."""
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    reason = value.get("reason") if isinstance(value, dict) else None
    return refusal(reason) if isinstance(reason, str) else None


def _named(field: str, what: str, *, in_spec: bool | None = None) -> ErrorBody:
    """400 naming ``field`` (``bad_spec`` for a field of the spec)."""
    if in_spec is None:
        in_spec = field.startswith("spec.")
    return ErrorBody(
        code="bad_spec" if in_spec else "bad_request", message=cut(f"{field}: {what}"), field=field
    )


def beyond(value: object, path: str = "", depth: int = 0) -> ErrorBody | None:
    """The first part of a decoded body nested deeper than :data:`MAX_DEPTH`, or
    holding an integer outside :data:`INT64` (None: none)."""
    if depth > MAX_DEPTH:
        return _named(BODY, f"nested deeper than {MAX_DEPTH} levels", in_spec=False)
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = INT64
        if low <= value <= high:
            return None
        own = ALLOWED.get(path)  # a field's own range, else the chain's integers
        return _named(
            path, f"{value} is out of range: allowed {own or f'{low} to {high} (64-bit)'}"
        )
    if isinstance(value, msgspec.Struct):
        items: Iterable[tuple[object, object]] = (
            (name, getattr(value, name)) for name in value.__struct_fields__
        )
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, inner in items:
        found = beyond(inner, f"{path}.{key}" if path else str(key), depth + 1)
        if found is not None:
            return found
    return None


def _body_type(scope: dict[str, Any]) -> tuple[type[msgspec.Struct], bool] | None:
    if scope["type"] != "http" or scope["method"] not in ("POST", "PUT"):
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
            await _refuse(send, 413, TOO_LARGE)
            return
        if not body.strip() and optional:
            body = b""  # no body: the route's defaults (blank space would not decode)
        else:
            refusal = _check(scope, body, body_type)
            if refusal is not None:
                await _refuse(send, *refusal)
                return
        await app(scope, replayed(body), send)

    return middleware


def _check(
    scope: dict[str, Any], body: bytes, body_type: type[msgspec.Struct]
) -> tuple[int, ErrorBody] | None:
    """(status, error) refusing a body that is not JSON of ``body_type``; None: it is."""
    given = _content_type(scope)
    if given.split(";", 1)[0].strip().lower() != JSON:
        what = f"Content-Type {given!r}" if given else "no Content-Type"
        message = f"{what}: a body must be sent as Content-Type: {JSON}"
        return 415, ErrorBody(code="unsupported_media_type", field="Content-Type", message=message)
    try:
        decoded = _DECODERS[body_type].decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        return 400, explain(e, body_type, body)
    except RecursionError:
        return 400, _named(BODY, f"nested deeper than {MAX_DEPTH} levels", in_spec=False)
    found = beyond(decoded) or _twice(body)
    return None if found is None else (400, found)


def _twice(body: bytes) -> ErrorBody | None:
    """A key given twice in one object (:mod:`.json_keys`), named with its path."""
    field = duplicated_key(body)
    if field is None:
        return None
    return _named(field, "given twice in one object: give each key once (msgspec keeps the last)")


def _content_type(scope: dict[str, Any]) -> str:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bytes(value).decode("latin-1")
    return ""


async def _refuse(send: Any, status: int, error: ErrorBody) -> None:
    raw = msgspec.json.encode(ErrorEnvelope(error=error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})
