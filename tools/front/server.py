"""Serving the front: uvicorn on its own thread and event loop, beside the
node's actors and the control API's server (tools/api/serving/server.py).

uvicorn with the httptools parser on a uvloop event loop (both the
``uvicorn[standard]`` choice: a C parser, where the control API's h11 is pure
Python, and an event loop in C, libuv, where asyncio's own runs each socket's
readiness through Python; the front's requests and streams are the node's hot
path: bench/README.md, stop 33, measured the node's CPU per request and per
streamed token a third lower). Without uvloop (a platform without its wheel)
the front runs on asyncio's loop, the same code. The socket is bound before the node opens: requests
are answered 503 ``node_starting`` until :meth:`FrontServer.serve`, 503
``node_stopping`` once :meth:`~FrontServer.stopping` is called;
:meth:`~FrontServer.close` ends the streams and stops serving.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import uvicorn

from ..api.auth import TcpAddress, Tokens
from ..api.errors import ApiError
from ..api.limits import ACCEPT_BATCH, LISTEN_BACKLOG, ConnectionLimits, Listeners
from ..netkit.listener import ListenError, bind_tcp, uvicorn_config
from .app import FrontApp
from .connection import protocol_for
from .proxy import Proxy
from .settings import FrontConfig
from .tally import FrontCollector, FrontTally

if TYPE_CHECKING:
    from infervisor.actors.node import Node

#: The front's event loop: uvloop's, else asyncio's (None: asyncio.Runner's default).
LOOP_FACTORY: Callable[[], asyncio.AbstractEventLoop] | None
try:
    import uvloop

    LOOP_FACTORY = uvloop.new_event_loop
except ImportError:  # pragma: no cover - a platform without uvloop's wheel
    LOOP_FACTORY = None

__all__ = ["FrontServer"]

log = logging.getLogger(__name__)

#: Seconds the server waits for open streams when it closes.
CLOSE_GRACE_S = 3.0
_STARTED_S = 10.0


class FrontServer:
    """The node's OpenAI-compatible endpoint on ``address``."""

    def __init__(
        self, config: FrontConfig, address: TcpAddress, tokens: Tokens, node_id: str
    ) -> None:
        self.config = config
        self.address = address
        self.app = FrontApp(tokens, node_id)
        self.tally = FrontTally()
        #: The open client connections, and what is shed when the front is full
        #: (the control API's own bookkeeping: .connection).
        self.listeners = Listeners(ConnectionLimits(max_connections=config.max_connections))
        self._sock = _bind(address)
        uv = uvicorn_config(
            self.app,
            # httptools with the connection limit and the arrival deadline; no
            # limit_concurrency: uvicorn's own 503 is plain text and sheds nothing
            http=protocol_for(self.listeners),
            lifespan="off",
            date_header=False,
            backlog=ACCEPT_BATCH,  # asyncio accepts this many at once (tools/api/limits.py)
            timeout_keep_alive=30,
            timeout_graceful_shutdown=int(CLOSE_GRACE_S),
        )
        self._server = uvicorn.Server(uv)
        self._thread = threading.Thread(target=self._run, name="infervisor-front", daemon=True)
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def listen(
        cls, config: FrontConfig, address: TcpAddress, tokens: Tokens, node_id: str
    ) -> FrontServer:
        """Bind ``address`` and answer 503 until :meth:`serve`.

        Raises:
            ApiError: the address cannot be bound (the port in use: named).
        """
        server = cls(config, address, tokens, node_id)
        server._thread.start()
        server._wait_started()
        # asyncio listened with ACCEPT_BATCH, also its accept batch: a second listen()
        # deepens only the kernel's queue (as the control API's listeners do)
        server._sock.listen(LISTEN_BACKLOG)
        return server

    @property
    def url(self) -> str:
        """``http://host:port`` of the endpoint (its OpenAI base URL adds ``/v1``)."""
        return self.address.url

    def collector(self) -> FrontCollector:
        """The front's metrics, for the node's ``/metrics`` (tools/api/metrics.py)."""
        return FrontCollector(self.tally)

    def serve(self, node: Node) -> None:
        """Route requests to ``node``'s instances from now on."""
        proxy = Proxy(
            node,
            queue_limit=self.config.queue_limit,
            upstream_timeout_s=self.config.upstream_timeout_s,
            stream_flush_interval_s=self.config.stream_flush_interval_s,
        )
        proxy.tally = self.tally
        self.app.proxy = proxy

    def stopping(self) -> None:
        """Answer new requests 503 ``node_stopping`` (those in flight go on)."""
        self.app.stopping = True

    def close(self) -> None:
        """Stop serving, close the upstream connections and the socket (idempotent)."""
        self.app.stopping = True
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(CLOSE_GRACE_S + 5)
        self._sock.close()

    def __enter__(self) -> FrontServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=LOOP_FACTORY) as runner:
                runner.run(self._serve())
        except BaseException as e:
            self._failed = e
            log.exception("the front stopped")

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._sock])
        finally:
            proxy = self.app.proxy
            if proxy is not None:
                await proxy.aclose()

    def _wait_started(self) -> None:
        deadline = time.monotonic() + _STARTED_S
        while not self._server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise ApiError(f"the front did not start: {self._failed}", "node_error", 500)
            if time.monotonic() > deadline:
                raise ApiError(f"the front did not start in {_STARTED_S:g} s")
            time.sleep(0.01)


def _bind(address: TcpAddress) -> socket.socket:
    try:
        return bind_tcp(address.host, address.port, ACCEPT_BATCH, key="front.listen")
    except ListenError as e:
        raise ApiError(str(e), e.code, e.status, e.key) from e
