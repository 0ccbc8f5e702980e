"""Idempotent retries: a POST repeated with the same ``Idempotency-Key`` gets
the first answer again and the node does nothing more.

The behaviour follows the IETF draft "The Idempotency-Key HTTP Header Field"
(draft-ietf-httpapi-idempotency-key-header): a key is the client's; the
first request with it is done and its answer stored; a repeat of the same
request (same caller, method, path and body) is answered from the store; a
repeat while the first is still in flight is refused with 409; a key reused
for a different request is refused with 422. A 503 (the node starting or
stopping: nothing was done) is not stored, nor a request the app failed to
answer, so a retry is done; every other answer is, 500 and 504 included
(the verb was accepted and recorded: doing it again would do it twice).

The store is the running node's memory (bounded, :data:`MAX_KEYS`, oldest
out first): a key does not outlive the node. A retry after a node restart is
done again, which the verbs tolerate: a placement of the same spec and
generation is ``unchanged``, a start of a running instance answers it as
running (nothing recorded), a stop of a stopped one as stopped.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import msgspec

from ..netkit.framing import body_too_large
from .wire import ErrorBody, ErrorEnvelope

__all__ = [
    "HEADER",
    "MAX_KEYS",
    "MAX_KEY_LENGTH",
    "TOO_LARGE",
    "BodyCut",
    "IdempotencyStore",
    "idempotent",
    "read_body",
]

HEADER = b"idempotency-key"
#: Keys kept; past this the oldest answer is forgotten.
MAX_KEYS = 10_000
MAX_KEY_LENGTH = 255
#: Largest body read to fingerprint, bytes (as tools/api/strict.py).
MAX_BODY = 1024 * 1024

Scope = dict[str, Any]


class BodyCut(Exception):
    """The connection closed before the whole body arrived (the client went away, or
    its body missed the read deadline, tools/api/limits.py): nobody is left to
    answer, and a verb must not run on part of a body."""


class _Stored(msgspec.Struct):
    fingerprint: bytes
    status: int = 0
    headers: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)
    body: bytes = b""
    done: bool = False


class IdempotencyStore:
    """Answers by (caller, key). Used on the server's event loop only: no lock."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._answers: OrderedDict[tuple[str, bytes], _Stored] = OrderedDict()
        self._max = max_keys

    def __len__(self) -> int:
        return len(self._answers)

    def begin(self, slot: tuple[str, bytes], fingerprint: bytes) -> _Stored | ErrorBody | None:
        """None: go on (the request is now in flight); the stored answer; or a refusal."""
        found = self._answers.get(slot)
        if found is None:
            self._answers[slot] = _Stored(fingerprint)
            while len(self._answers) > self._max:
                self._answers.popitem(last=False)
            return None
        if found.fingerprint != fingerprint:
            return ErrorBody(
                code="idempotency_mismatch",
                field="Idempotency-Key",
                message="this Idempotency-Key was used for a different request; "
                "use a new key for each request",
            )
        if not found.done:
            return ErrorBody(
                code="idempotency_in_flight",
                field="Idempotency-Key",
                message="the first request with this Idempotency-Key is still in progress; "
                "retry once it is answered",
            )
        return found

    def finish(self, slot: tuple[str, bytes], stored: _Stored) -> None:
        """Keep ``stored``, or forget the key: a 503 (nothing done) or no answer (status 0)."""
        if stored.status in (0, 503):
            self._answers.pop(slot, None)
        else:
            stored.done = True
            self._answers[slot] = stored


def idempotent(app: Any, store: IdempotencyStore) -> Any:
    """ASGI middleware around ``app``: POSTs with an ``Idempotency-Key`` header.

    Runs inside the authentication middleware: ``scope["infervisor.identity"]``
    names the caller, so one caller's keys never answer another's requests.
    """

    async def middleware(scope: Scope, receive: Any, send: Any) -> None:
        key = _key(scope)
        if key is None:
            await app(scope, receive, send)
            return
        refused = _bad_key(key)
        if refused is not None:
            await _send_error(send, 400, refused)
            return
        try:
            body = await read_body(receive, limit=MAX_BODY)
        except BodyCut:
            return  # the caller is gone: nothing done, nothing to answer
        if body is None:
            await _send_error(send, 413, TOO_LARGE)
            return
        slot = (str(scope.get("infervisor.identity", "")), key)
        fingerprint = _fingerprint(scope, body)
        found = store.begin(slot, fingerprint)
        if isinstance(found, ErrorBody):
            status = 422 if found.code == "idempotency_mismatch" else 409
            await _send_error(send, status, found)
            return
        if found is not None:
            await _replay(send, found)
            return
        stored = _Stored(fingerprint)
        try:
            await app(scope, replayed(body), _capturing(send, stored))
        finally:
            store.finish(slot, stored)  # status 0: the app failed before answering

    return middleware


_OVER = body_too_large(MAX_BODY)
#: A body over :data:`MAX_BODY`, in the words the listeners use (tools/netkit/framing.py;
#: they refuse it first, as it arrives; this answers it where the app is served alone).
TOO_LARGE = ErrorBody(code=_OVER.code, field=_OVER.field, message=_OVER.message)


def _bad_key(key: bytes) -> ErrorBody | None:
    """The 400 for a key that cannot name a request (empty, too long); None: it can."""
    if not key.strip():
        return ErrorBody(
            code="bad_request",
            field="Idempotency-Key",
            message="an Idempotency-Key is empty: send a unique key per request "
            "(e.g. a UUID), or no header",
        )
    if len(key) > MAX_KEY_LENGTH:
        return ErrorBody(
            code="bad_request",
            field="Idempotency-Key",
            message=f"an Idempotency-Key is at most {MAX_KEY_LENGTH} bytes",
        )
    return None


def _fingerprint(scope: Scope, body: bytes) -> bytes:
    """What makes two requests the same one: method, path and body (SHA-256)."""
    return hashlib.sha256(
        b"\0".join([scope["method"].encode(), scope["path"].encode(), body])
    ).digest()


def _key(scope: Scope) -> bytes | None:
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    for name, value in scope["headers"]:
        if name == HEADER:
            return bytes(value)
    return None


async def read_body(receive: Any, limit: int | None = None) -> bytes | None:
    """The whole request body (None: it is longer than ``limit`` bytes).

    Raises:
        BodyCut: the connection closed before the body's end.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise BodyCut
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def replayed(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _capturing(send: Any, stored: _Stored) -> Any:
    async def capture(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            stored.status = message["status"]
            stored.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            stored.body += message.get("body", b"")
        await send(message)

    return capture


async def _replay(send: Any, stored: _Stored) -> None:
    headers = [*stored.headers, (b"idempotent-replayed", b"true")]
    await send({"type": "http.response.start", "status": stored.status, "headers": headers})
    await send({"type": "http.response.body", "body": stored.body})


async def _send_error(send: Any, status: int, error: ErrorBody) -> None:
    body = msgspec.json.encode(ErrorEnvelope(error=error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
