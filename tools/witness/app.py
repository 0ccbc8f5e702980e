"""The witness's HTTP surface: a small ASGI app over :class:`~.service.Witness`.

Routes (c2sp.org/tlog-witness)::

    POST /add-checkpoint             the request body of the spec; 200/400/403/404/409/422
    GET  /<sha256(origin) hex>/checkpoint   the latest cosigned checkpoint; 404 if none
    GET  /                           the witness's verifier key (text/plain), for configs

A body over :data:`~infervisor.chain.witness_protocol.MAX_REQUEST_BYTES` is
answered 413 without being read whole; a wrong method 405. The work of a
request (verifying, fsyncing) runs on a worker thread, so one slow disk does
not stop other connections from being read. An error of the witness's own is
logged and answered 500 without detail; nothing a caller sends leads there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from infervisor.chain.witness_protocol import ADD_CHECKPOINT, MAX_REQUEST_BYTES

from .service import Answer, Witness

__all__ = ["build_app"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", (message + "\n").encode())


class _TooLarge(Exception):
    pass


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    """The request body; _TooLarge past MAX_REQUEST_BYTES (declared or sent)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length" and (not value.isdigit() or int(value) > MAX_REQUEST_BYTES):
            raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, answer: Answer, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [
        (b"content-type", answer.content_type.encode("latin-1")),
        (b"content-length", str(len(answer.body)).encode("ascii")),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})


def build_app(witness: Witness) -> App:
    """The ASGI app serving ``witness``."""
    vkey = _text(200, witness.cosigner.key.key_string())

    async def route(scope: Scope, receive: Receive) -> tuple[Answer, list[tuple[bytes, bytes]]]:
        method, path = scope["method"], scope["path"]
        if path == ADD_CHECKPOINT:
            if method != "POST":
                return _text(405, "add-checkpoint takes POST"), [(b"allow", b"POST")]
            try:
                body = await _read_body(scope, receive)
            except _TooLarge:
                return _text(413, f"request body over {MAX_REQUEST_BYTES} bytes"), [
                    (b"connection", b"close")
                ]
            return await asyncio.to_thread(witness.add_checkpoint, body), []
        if method not in ("GET", "HEAD"):
            return _text(405, f"{path[:100]} takes GET"), [(b"allow", b"GET")]
        if path == "/":
            return vkey, []
        answer = await asyncio.to_thread(witness.checkpoint, path)
        return answer or _text(404, f"no such path {path[:100]!r}"), []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            answer, extra = await route(scope, receive)
        except ConnectionError:
            return
        except Exception:
            log.exception("witness: error answering %s %s", scope["method"], scope["path"][:100])
            answer, extra = _text(500, "internal error of the witness (logged)"), []
        await _send(send, answer, extra)

    return app
