"""The HTTP transport of the control API's Unix socket, without httpcore's socket leak.

httpcore 1.0's ``SyncBackend.connect_unix_socket`` does not close the socket
it made when ``connect()`` fails (no node, a stale ``api.sock``): the socket
is closed only by the garbage collector, with a ``ResourceWarning``. A client
that retries while a node restarts leaks one per attempt. This backend
closes it and raises the same httpcore errors, so httpx maps them as before.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

import httpcore
import httpx
from httpcore._backends.sync import SyncStream

from infervisor.adapters.tls import client_tls

__all__ = ["unix_transport"]


class _ClosingBackend(httpcore.SyncBackend):
    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(path)
        except TimeoutError as e:
            sock.close()
            raise httpcore.ConnectTimeout(str(e)) from e
        except OSError as e:
            sock.close()
            raise httpcore.ConnectError(str(e)) from e
        return SyncStream(sock)


def unix_transport(path: str) -> httpx.HTTPTransport:
    """An httpx transport to the Unix socket at `path` that closes failed sockets."""
    transport = httpx.HTTPTransport(uds=path, verify=client_tls())
    # httpx takes no network backend; its pool keeps the one it connects with.
    transport._pool._network_backend = _ClosingBackend()
    return transport
