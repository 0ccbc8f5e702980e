"""What the front reads of a request body: the model it names, and the fields
each route cannot do without (named in a 400 when missing or mistyped).

The body itself goes upstream unchanged (re-encoded only for an Ollama
instance: a model asked for by another name is given Ollama's, and a managed
instance's ``keep_alive`` is the node's, :data:`KEEP_ALIVE_ROUTES`): only these
fields are decoded, with msgspec. A body that gives a key twice in one object
is refused as the control API refuses it (:mod:`..api.json_keys`): msgspec
keeps the last, so ``{"model": "a", ..., "model": "b"}`` would route by "b"
while a server that keeps the first would answer for "a". That scan is the
standard library's C scanner over the body once more (bench/front_body.py).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ..api.json_keys import duplicated_key
from ..api.json_words import malformed, not_an_object
from .errors import FrontError

__all__ = ["KEEP_ALIVE_ROUTES", "ROUTES", "Asked", "parse", "rewritten"]


class _Chat(msgspec.Struct):
    model: str
    messages: list[Any]
    stream: bool | None = None


class _Completion(msgspec.Struct):
    model: str
    prompt: str | list[Any]
    stream: bool | None = None


class _Embedding(msgspec.Struct):
    model: str
    input: str | list[Any]


class _OllamaModel(msgspec.Struct):
    """Ollama's routes: ``model`` (``name`` in older clients' ``/api/show``)."""

    model: str | None = None
    name: str | None = None
    stream: bool | None = None


class _OllamaEmbed(msgspec.Struct):
    model: str
    input: str | list[Any]


class _OllamaEmbeddings(msgspec.Struct):
    model: str
    prompt: str


#: POST path -> (its body's type, an Ollama native route).
ROUTES: dict[str, tuple[type[msgspec.Struct], bool]] = {
    "/v1/chat/completions": (_Chat, False),
    "/v1/completions": (_Completion, False),
    "/v1/embeddings": (_Embedding, False),
    "/api/chat": (_OllamaModel, True),
    "/api/generate": (_OllamaModel, True),
    "/api/embed": (_OllamaEmbed, True),
    "/api/embeddings": (_OllamaEmbeddings, True),
    "/api/show": (_OllamaModel, True),
}

#: Ollama's native routes that load the model and carry a ``keep_alive`` (its
#: ``docs/api.md``): a managed instance's is set by the node, not the client.
KEEP_ALIVE_ROUTES = frozenset({"/api/generate", "/api/chat", "/api/embed", "/api/embeddings"})

_DECODERS = {path: msgspec.json.Decoder(kind) for path, (kind, _) in ROUTES.items()}
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")


class Asked(msgspec.Struct, frozen=True):
    """What a request asks for: ``model``, whether the route is Ollama's own,
    whether the body asks for a stream (``stream: true``), and whether it asks
    for embeddings (``/v1/embeddings``: an instance placed with ``embeddings =
    true`` is preferred among equals)."""

    model: str
    ollama: bool
    stream: bool = False
    embeddings: bool = False


def parse(path: str, body: bytes) -> Asked:
    """The model a POST to ``path`` asks for.

    Raises:
        FrontError: 400 ``invalid_body`` naming the field (``param``) that is
            missing or of the wrong type, or given twice in one object
            (``messages.0.role``), or saying the body is not a JSON object.
    """
    try:
        got = _DECODERS[path].decode(body)
    except msgspec.ValidationError as e:
        whole = not_an_object(e)
        if whole is not None:
            raise FrontError(400, f"{path}: {whole}", "invalid_body", param=None) from None
        raise _bad(path, str(e)) from None
    except msgspec.DecodeError as e:
        raise FrontError(400, f"{path}: {malformed(e, body)}", "invalid_body", param=None) from None
    if (twice := duplicated_key(body)) is not None:
        raise _twice(path, twice)
    model = getattr(got, "model", None) or getattr(got, "name", None)
    if not model:
        raise FrontError(
            400,
            f"{path}: `model` is required (a model name or role: GET /v1/models)",
            "invalid_body",
            param="model",
        )
    stream = getattr(got, "stream", None) is True
    return Asked(model, ROUTES[path][1], stream, embeddings=path == "/v1/embeddings")


def rewritten(
    body: bytes, *, model: str | None = None, keep_alive: str | int | None = None
) -> bytes:
    """``body`` (a JSON object :func:`parse` read) with its ``model`` (and an old
    client's ``name``) set to ``model`` and its ``keep_alive`` to ``keep_alive``,
    whatever the client gave (None: that field as it was)."""
    doc = msgspec.json.decode(body)
    if model is not None:
        doc["model"] = model
        doc.pop("name", None)
    if keep_alive is not None:
        doc["keep_alive"] = keep_alive
    return msgspec.json.encode(doc)


def _twice(path: str, field: str) -> FrontError:
    text = f"{path}: `{field}`: given twice in one object: give each key once"
    return FrontError(400, text, "invalid_body", param=field)


def _bad(path: str, message: str) -> FrontError:
    match = _AT.match(message)
    what = match["what"] if match else message
    field = (match["path"] if match else None) or None
    if missing := _MISSING.match(what):
        field = missing["key"]
        text = f"{path}: `{field}` is required"
    elif field is None:
        text = f"{path}: the body must be a JSON object ({what})"
    else:
        text = f"{path}: `{field}`: {what[:1].lower()}{what[1:]}"
    return FrontError(400, text, "invalid_body", param=field)
