"""Serving the control API: uvicorn on the data directory's Unix socket and,
when configured, a loopback TCP port.

uvicorn is the server (the ASGI reference server, maintained by the
Encode team; h11 underneath): it serves pre-bound sockets, so the Unix
socket is made mode 0600 before ``listen()`` and nobody can connect earlier.
It runs on its own thread and event loop, beside the node's actors. Each
connection's peer is read from the kernel (``SO_PEERCRED``) when it is
accepted and handed to the app in the ASGI scope. Each listener caps its
connections and bounds how long a request head and body may take
(:mod:`.limits`, :mod:`.connection`; docs/api.md "Connection limits").

Lifecycle (``infervisor run``): :meth:`ApiServer.listen` (answers 503
``node_starting``), :meth:`~ApiServer.serve` once the node is open,
:meth:`~ApiServer.stopping` when a signal arrives (changes answer 503; it
returns once the verbs in flight are answered), then :meth:`~ApiServer.close`
after the node's shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import uvicorn

from infervisor.actors.node import Node
from infervisor.chain import StoredEvent

from ...netkit.listener import ListenError, bind_tcp, uvicorn_config
from ..auth import TcpAddress, Tokens
from ..connection import protocol_for
from ..context import ApiContext
from ..errors import ApiError
from ..limits import ACCEPT_BATCH, LISTEN_BACKLOG, ConnectionLimits, Listeners
from ..middleware import wrap
from .app import build_app

__all__ = ["MAX_SOCKET_PATH", "SOCKET_FILE", "ApiServer", "check_socket_path", "socket_path"]

log = logging.getLogger(__name__)

#: The socket's name in the data directory.
SOCKET_FILE = "api.sock"
#: sun_path holds 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107
#: Seconds the server waits for open connections (streams) at close.
CLOSE_GRACE_S = 3.0
_STARTED_S = 10.0


def socket_path(data_dir: Path | str) -> Path:
    """The control API's socket of the node on ``data_dir``."""
    return Path(data_dir) / SOCKET_FILE


def check_socket_path(path: Path) -> None:
    """Raise ApiError when ``path`` is too long to bind a Unix socket to."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise ApiError(
            f"the API socket {path} would be {size} bytes long; a Unix socket path holds at "
            f"most {MAX_SOCKET_PATH}: use a shorter data_dir",
            "bad_config",
            400,
            "node.data_dir",
        )


class ApiServer:
    """The running node's API on ``<data_dir>/api.sock`` (and ``tcp`` when given)."""

    def __init__(
        self,
        ctx: ApiContext,
        sockets: list[socket.socket],
        path: Path,
        tcp: TcpAddress | None,
        limits: ConnectionLimits,
    ) -> None:
        self.ctx = ctx
        self.path = path
        self.tcp = tcp
        self.listeners = Listeners(limits)
        self._sockets = sockets
        config = uvicorn_config(
            wrap(build_app(ctx), ctx),
            http=protocol_for(self.listeners),  # the cap, the read deadlines, the peer
            backlog=ACCEPT_BATCH,  # asyncio accepts this many at once (see limits.py)
            lifespan="on",
            timeout_graceful_shutdown=int(CLOSE_GRACE_S),
            timeout_keep_alive=math.ceil(limits.keep_alive_s),  # exact per connection
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="infervisor-api", daemon=True)
        self._failed: BaseException | None = None

    @classmethod
    def listen(
        cls,
        data_dir: Path,
        chain_path: Path,
        node_id: str,
        *,
        tcp: TcpAddress | None = None,
        tokens: Tokens | None = None,
        metrics: Callable[[], tuple[bytes, str]] | None = None,
        limits: ConnectionLimits | None = None,
    ) -> ApiServer:
        """Bind the socket (0600) and the TCP port, and serve 503 until :meth:`serve`.

        ``limits`` (default :class:`ConnectionLimits`) caps each listener's
        connections and bounds how long a request head and body may take.

        Raises:
            ApiError: the socket path is too long or taken by something else, or a
                listener cannot be bound (the port in use: named).
        """
        path = socket_path(data_dir)
        check_socket_path(path)
        _remove_stale(path)
        ctx = ApiContext(
            data_dir=Path(data_dir),
            chain_path=Path(chain_path),
            node_id=node_id,
            node_uid=os.geteuid(),
            tokens=tokens,
            api_port=tcp.port if tcp is not None else None,
            own_ports={} if tcp is None else {tcp.port: "API port (api.tcp)"},
            metrics=metrics,
        )
        sockets = [_bind_unix(path)]
        if tcp is not None:
            try:
                sockets.append(_bind_tcp(tcp))
            except BaseException:
                sockets[0].close()
                path.unlink(missing_ok=True)
                raise
        server = cls(ctx, sockets, path, tcp, limits or ConnectionLimits())
        server._thread.start()
        server._wait_started()
        # asyncio listened with ACCEPT_BATCH, which is also its accept batch; a second
        # listen() deepens only the kernel's queue (no descriptor of the node's).
        for sock in sockets:
            sock.listen(LISTEN_BACKLOG)
        return server

    @property
    def url(self) -> str | None:
        """The TCP listener's URL, or None."""
        return self.tcp.url if self.tcp is not None else None

    def notify(self, event: StoredEvent) -> None:
        """The chain holds ``event`` now: wake the watch streams (any thread)."""
        self.ctx.hub.notify(event.seq)

    def serve(self, node: Node) -> None:
        """Take requests for ``node`` from now on.

        Raises:
            ApiError: an instance of the node uses the API's own TCP port.
        """
        if self.ctx.api_port is not None:
            for view in node.list():
                if view.endpoint.rsplit(":", 1)[-1].rstrip("/") == str(self.ctx.api_port):
                    raise ApiError(
                        f"instance {view.instance_id} uses port {self.ctx.api_port}, the API's "
                        "own (api.tcp): choose another api.tcp port",
                        "port_taken",
                        409,
                        "api.tcp",
                    )
        self.ctx.gate.open(node)

    def stopping(self, timeout_s: float | None = None) -> bool:
        """Refuse changes (503) from now on; True once no changing verb is in flight."""
        return self.ctx.gate.stopping(timeout_s)

    def close(self) -> None:
        """Refuse everything, end the streams, stop serving and remove the socket (idempotent)."""
        self.ctx.gate.close()
        self.ctx.hub.close()
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(CLOSE_GRACE_S + 5)
        for sock in self._sockets:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    def _run(self) -> None:
        try:
            asyncio.run(self._server.serve(sockets=self._sockets))
        except BaseException as e:
            self._failed = e
            log.exception("the API server stopped")

    def _wait_started(self) -> None:
        deadline = time.monotonic() + _STARTED_S
        while not self._server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise ApiError(f"the API server did not start: {self._failed}", "node_error", 500)
            if time.monotonic() > deadline:
                raise ApiError(f"the API server did not start in {_STARTED_S:g} s")
            time.sleep(0.01)


#: Where the socket is bound before it takes its name: no longer than the name
#: itself, so a path that fits a Unix socket address fits this one too.
STAGING_FILE = ".api.new"


def _bind_unix(path: Path) -> socket.socket:
    """Listen on ``path``, which appears only once it accepts connections.

    The socket is bound, made 0600 and listening under :data:`STAGING_FILE`
    and then renamed into place (one data directory has one node: run.lock),
    so a client that sees the file never gets ECONNREFUSED from a node that
    is starting, as it could between ``bind()`` and ``listen()``.

    Raises:
        ApiError: ``bad_config``, the socket cannot be made there.
    """
    staging = path.with_name(STAGING_FILE)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        staging.unlink(missing_ok=True)  # what a node killed right here left
        sock.bind(str(staging))
        os.chmod(staging, 0o600)  # before listen(): nobody connects earlier
        sock.listen(ACCEPT_BATCH)
        os.replace(staging, path)
    except OSError as e:
        sock.close()
        staging.unlink(missing_ok=True)
        raise ApiError(f"cannot listen on {path}: {e.strerror or e}", "bad_config", 400) from e
    sock.setblocking(False)
    return sock


def _bind_tcp(address: TcpAddress) -> socket.socket:
    try:
        return bind_tcp(address.host, address.port, ACCEPT_BATCH, key="api.tcp")
    except ListenError as e:
        raise ApiError(str(e), e.code, e.status, e.key) from e


def _remove_stale(path: Path) -> None:
    """Remove the socket a crashed node left; refuse anything else at that path."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise ApiError(f"cannot check {path}: {e.strerror or e}", "bad_config", 400) from e
    if not stat.S_ISSOCK(mode):
        raise ApiError(f"{path} exists and is not a socket; move it away", "bad_config", 400)
    try:
        path.unlink()
    except OSError as e:
        raise ApiError(
            f"cannot remove the stale {path}: {e.strerror or e}", "bad_config", 400
        ) from e
