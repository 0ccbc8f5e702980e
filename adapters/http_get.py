"""A keep-alive HTTP/1.1 GET for health probes, on the standard library's ``http.client``.

Probes are the node's hottest path: every instance is asked ``/health`` on
every tick. Through httpx two GETs cost about four times the CPU of the same
requests with ``http.client`` (bench/README.md), most of it in httpx's
request and response models, which a probe does not need. ``http.client`` is
the lower-level, well-kept alternative: it parses the response (no
hand-written HTTP), keeps the connection open between probes, and takes a
socket timeout. httpx stays where its features serve (the completion POSTs of
deep health, the Ollama API).

One :class:`KeepAliveGet` per server; it is not thread-safe (each instance's
actor owns its own).
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

__all__ = ["GetFailed", "GetReply", "KeepAliveGet"]

# A server that closed a kept-alive connection between two probes: the request
# is sent again once, on a new connection (GET is idempotent).
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class GetFailed(Exception):
    """The request got no HTTP answer; ``str()`` says why.

    ``stage`` is ``connect`` (refused, unreachable), ``timeout`` (no answer
    within the timeout) or ``answer`` (reset, or not HTTP).
    """

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(detail)
        self.stage = stage


class GetReply:
    """A response: ``status``, ``body`` (at most ``max_body`` bytes) and ``truncated``."""

    __slots__ = ("body", "status", "truncated")

    def __init__(self, status: int, body: bytes, truncated: bool) -> None:
        self.status, self.body, self.truncated = status, body, truncated


class KeepAliveGet:
    """GETs to one ``http://host:port`` (or https) over one kept-alive connection.

    ``timeout`` (seconds) bounds connecting and each socket read, as httpx's
    timeout does; ``max_body`` (bytes) bounds what is read of a body. A body
    larger than that is not drained: the connection is closed instead.

    Raises:
        ValueError: ``base_url`` is not ``http(s)://host[:port]``.
    """

    def __init__(self, base_url: str, timeout: float, max_body: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._timeout, self._max_body = timeout, max_body
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> GetReply:
        """``GET path``; the reply, with the body cut at ``max_body`` bytes.

        Raises:
            GetFailed: connection refused or reset, no answer within the
                timeout, or an answer that is not HTTP.
        """
        reused = self._conn is not None
        try:
            return self._once(path)
        except _STALE as e:
            self.close()
            if not reused:
                raise GetFailed("answer", _why(e)) from e
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _failed(e) from e
        try:
            return self._once(path)
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _failed(e) from e

    def close(self) -> None:
        """Close the connection (the next GET opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _once(self, path: str) -> GetReply:
        conn = self._conn or self._connect()
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(self._max_body + 1)
        truncated = len(body) > self._max_body
        if truncated or response.will_close or not response.isclosed():
            self.close()  # an unread rest, or the server said it closes
        return GetReply(response.status, body[: self._max_body], truncated)

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self._timeout)
        try:
            conn.connect()
        except TimeoutError as e:
            conn.close()
            raise GetFailed("timeout", "timed out connecting") from e
        except OSError as e:
            conn.close()
            raise GetFailed("connect", _why(e)) from e
        self._conn = conn
        return conn


def _failed(error: BaseException) -> GetFailed:
    if isinstance(error, GetFailed):
        return error
    if isinstance(error, TimeoutError):
        return GetFailed("timeout", "timed out")
    return GetFailed("answer", _why(error))


def _why(error: BaseException) -> str:
    if isinstance(error, http.client.HTTPException):
        return f"not an HTTP answer ({type(error).__name__}: {error})"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
