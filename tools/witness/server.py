"""Serving a witness: uvicorn on one TCP socket, in the calling thread, until a signal.

The socket is bound (and listening) before anything is printed, so a client
that read the "listening" line can connect. The control API's connection
protocol (:mod:`infervisor.tools.api.connection`) bounds the connections and
how long a request head and body may take (``read_timeout_s``). uvicorn
catches SIGINT and SIGTERM: it stops accepting, lets the requests in flight
finish (their state is stored before their answers anyway) and returns.
"""

from __future__ import annotations

import math
import socket
from types import FrameType

import uvicorn

from ..api.connection import protocol_for
from ..api.limits import ACCEPT_BATCH, ConnectionLimits, Listeners
from ..netkit.listener import ListenError, bind_tcp, uvicorn_config
from .app import build_app
from .config import ConfigError, WitnessConfig
from .service import Witness

__all__ = ["bind", "serve"]

CLOSE_GRACE_S = 5


class _Server(uvicorn.Server):
    """uvicorn's server, ending with status 0 after a clean stop on a signal.

    uvicorn re-raises the signal it caught once it has shut down (so the
    process dies of it); a witness that stopped cleanly exits 0 instead. A
    second signal forces the exit.
    """

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port``.

    Raises:
        ConfigError: the address cannot be bound (in use: named).
    """
    try:
        return bind_tcp(host, port, ACCEPT_BATCH)
    except ListenError as e:
        raise ConfigError(str(e)) from e


def serve(witness: Witness, config: WitnessConfig, sock: socket.socket) -> None:
    """Serve ``witness`` on ``sock`` until SIGINT or SIGTERM; returns after a clean stop."""
    limits = ConnectionLimits(
        max_connections=config.max_connections,
        read_timeout_s=config.read_timeout_s,
        keep_alive_s=30.0,
    )
    uv = uvicorn_config(
        build_app(witness),
        http=protocol_for(Listeners(limits)),
        lifespan="off",
        timeout_graceful_shutdown=CLOSE_GRACE_S,
        timeout_keep_alive=math.ceil(limits.keep_alive_s),
    )
    _Server(uv).run(sockets=[sock])
