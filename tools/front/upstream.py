"""The servers behind the front: one ``httpcore.AsyncConnectionPool`` per server
address, kept for the front's life (connections are reused across requests).

httpcore is the transport under httpx (the node's HTTP client); the front
uses it directly because httpx's layer above it (URL and header models, the
request and response classes, its transports) was a third of the front's
time per request (a py-spy profile: commit message) and the front needs none
of it: its requests go to loopback servers the node launched or adopted,
over plain HTTP/1.1, with the bytes of the answer passed on unchanged.

Exceptions (httpcore's are translated here, so :mod:`.proxy` never sees them)::

    UpstreamError               the server cannot be reached or did not answer
     +-- UpstreamRefused        no connection could be made (nothing listens)
     +-- UpstreamDropped        the connection closed before the answer's head
     +-- UpstreamTimeout        no answer (or no next piece) in time
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpcore
import msgspec

__all__ = [
    "Answer",
    "UpstreamDropped",
    "UpstreamError",
    "UpstreamRefused",
    "UpstreamTimeout",
    "Upstreams",
]

#: Seconds to open a connection to a server on this machine.
CONNECT_TIMEOUT_S = 5.0
#: Seconds an idle kept-alive connection is kept (llama-server's cpp-httplib
#: closes one after 5 s; httpx's default too).
KEEPALIVE_EXPIRY_S = 5.0
#: Idle connections kept per server.
KEEPALIVE_MAX = 512
#: Bytes of a ``GET`` answer read (``/api/tags``, ``/api/ps``).
GET_MAX = 16 << 20

Headers = Sequence[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The server cannot be reached, or its answer failed (the cause's text)."""


class UpstreamRefused(UpstreamError):
    """No connection could be made to the server."""


class UpstreamDropped(UpstreamError):
    """The server closed the connection without answering (a kept-alive one
    closed under the request, which may be sent again on another)."""


class UpstreamTimeout(UpstreamError):
    """The server did not answer, or send the next piece, in time."""


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """httpcore's errors as :class:`UpstreamError` (its type name kept in the text)."""
    try:
        yield
    except httpcore.TimeoutException as e:
        raise UpstreamTimeout(f"{type(e).__name__}: {e}") from e
    except httpcore.ConnectError as e:
        raise UpstreamRefused(f"{type(e).__name__}: {e}") from e
    except httpcore.RemoteProtocolError as e:
        raise UpstreamDropped(f"{type(e).__name__}: {e}") from e
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as e:
        raise UpstreamError(f"{type(e).__name__}: {e}") from e


class Answer:
    """A server's answer: its head, and its body as it arrives (:meth:`chunks`).

    Close it (:meth:`aclose`): a body not read to its end closes the connection,
    which is how the server learns that the client went away.
    """

    def __init__(self, response: httpcore.Response) -> None:
        self._response = response
        self.status: int = response.status
        self.headers: list[tuple[bytes, bytes]] = response.headers

    def header(self, name: bytes) -> bytes:
        """The first value of header ``name`` (lower case), ``b""`` when absent."""
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return b""

    async def chunks(self) -> AsyncGenerator[bytes]:
        """The body's bytes as they arrive, unchanged (no content decoding).

        Raises:
            UpstreamError: the server died or stalled (``UpstreamTimeout``) midway.
        """
        with _translated():
            async for chunk in self._response.aiter_stream():
                yield chunk

    async def aclose(self) -> None:
        """Give the connection back (kept alive) or close it (a body not read through)."""
        await self._response.aclose()


class _Server:
    """One server's pool and the parts of its requests that never change."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise UpstreamRefused(f"{base_url!r}: the front reaches only http://host:port servers")
        self.host = parts.hostname.encode("ascii")
        self.port = parts.port or 80
        self.authority = parts.netloc.encode("ascii")
        self.pool = httpcore.AsyncConnectionPool(
            max_connections=None,  # the front's own connection cap bounds the requests
            max_keepalive_connections=KEEPALIVE_MAX,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )

    def url(self, path: str) -> httpcore.URL:
        return httpcore.URL(scheme=b"http", host=self.host, port=self.port, target=path.encode())


class Upstreams:
    """An ``httpcore.AsyncConnectionPool`` per base URL (event loop thread only)."""

    def __init__(self, read_timeout_s: float) -> None:
        self._extensions: dict[str, Any] = {
            "timeout": {
                "connect": CONNECT_TIMEOUT_S,
                "read": read_timeout_s,
                "write": read_timeout_s,
                "pool": None,
            }
        }
        self._servers: dict[str, _Server] = {}

    def _server(self, base_url: str) -> _Server:
        found = self._servers.get(base_url)
        if found is None:
            found = self._servers[base_url] = _Server(base_url)
        return found

    async def send(
        self, base_url: str, method: str, path: str, headers: Headers, body: bytes
    ) -> Answer:
        """Send a request to the server at ``base_url`` (``http://host:port``); the
        answer once its head arrived (read its body with :meth:`Answer.chunks`).

        ``headers`` go as they are, after ``Host`` and ``Content-Length``.

        Raises:
            UpstreamError: no connection (``UpstreamRefused``), no answer in time
                (``UpstreamTimeout``), the connection closed before the answer
                (``UpstreamDropped``), or another transport failure.
        """
        server = self._server(base_url)
        head = [(b"host", server.authority), (b"content-length", str(len(body)).encode())]
        request = httpcore.Request(
            method.encode(),
            server.url(path),
            headers=[*head, *headers],
            content=body,
            extensions=self._extensions,
        )
        with _translated():
            return Answer(await server.pool.handle_async_request(request))

    async def get_json(self, base_url: str, path: str) -> Any:
        """The JSON document the server answers ``GET path`` with; None when its
        status is not 200 or its body is not JSON.

        Raises:
            UpstreamError: as :meth:`send`; also an answer over :data:`GET_MAX` bytes.
        """
        answer = await self.send(base_url, "GET", path, [(b"accept", b"application/json")], b"")
        try:
            if answer.status != 200:
                return None
            body = bytearray()
            async for chunk in answer.chunks():
                body += chunk
                if len(body) > GET_MAX:
                    raise UpstreamError(f"GET {path}: an answer over {GET_MAX} bytes")
        finally:
            await answer.aclose()
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError:
            return None

    async def aclose(self) -> None:
        """Close every pool and its connections."""
        servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            with contextlib.suppress(Exception):
                await asyncio.shield(s.pool.aclose())
