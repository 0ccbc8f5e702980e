"""The servers behind the front: one shared ``httpx.AsyncClient`` per server
address, kept for the front's life (connections are reused across requests).

httpx is already the node's HTTP client; its async client streams a body as
it arrives (``aiter_raw``: the bytes unchanged, no decoding), and closing a
response closes its connection, which is how the server learns that a client
went away.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

__all__ = ["Upstreams"]

#: Seconds to open a connection to a server on this machine.
CONNECT_TIMEOUT_S = 5.0


class Upstreams:
    """An ``httpx.AsyncClient`` per base URL (event loop thread only)."""

    def __init__(self, read_timeout_s: float) -> None:
        self._timeout = httpx.Timeout(
            connect=CONNECT_TIMEOUT_S, read=read_timeout_s, write=read_timeout_s, pool=None
        )
        # No pool bound: the front's own connection cap bounds the requests.
        self._limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
        self._clients: dict[str, httpx.AsyncClient] = {}

    def client(self, base_url: str) -> httpx.AsyncClient:
        """The shared client of ``base_url`` (``http://host:port``)."""
        found = self._clients.get(base_url)
        if found is None:
            found = httpx.AsyncClient(
                base_url=base_url,
                timeout=self._timeout,
                limits=self._limits,
                trust_env=False,  # never a proxy from the environment: loopback servers
                # plain http only: no TLS context (loading the CA bundle took 0.25 s of
                # the first request's time to first token)
                verify=False,  # noqa: S501 - no https upstream exists
                follow_redirects=False,
            )
            self._clients[base_url] = found
        return found

    async def aclose(self) -> None:
        """Close every client and its connections."""
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                await asyncio.shield(c.aclose())
