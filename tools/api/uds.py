"""The HTTP transport of the control API's Unix socket, without httpcore's socket leak;
and who listens on the socket, for a node that takes connections and does not answer.

httpcore 1.0's ``SyncBackend.connect_unix_socket`` does not close the socket
it made when ``connect()`` fails (no node, a stale ``api.sock``): the socket
is closed only by the garbage collector, with a ``ResourceWarning``. A client
that retries while a node restarts leaks one per attempt. This backend
closes it and raises the same httpcore errors, so httpx maps them as before.

:func:`listener` says which process listens on the socket and whether it is
stopped, so that a node that takes a connection but does not answer (a
SIGSTOP, Ctrl-Z) is told apart from one that runs but is stuck: the kernel
gives a connected Unix socket's peer credentials, those of the process that
called ``listen()`` (SO_PEERCRED, Linux), and psutil the process's state.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import NamedTuple

import httpcore
import httpx
from httpcore._backends.sync import SyncStream

from infervisor.adapters.tls import client_tls

__all__ = ["Listener", "listener", "unix_transport"]


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


class Listener(NamedTuple):
    """The process listening on a Unix socket: its pid, and whether it is stopped
    (SIGSTOP, SIGTSTP: it resumes with SIGCONT)."""

    pid: int
    stopped: bool


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def listener(path: str) -> Listener | None:
    """Who listens on the Unix socket at ``path``, or None when that cannot be
    told (no SO_PEERCRED on this system, its queue full, nothing listening, the
    process gone). Does not block: the connect is non-blocking and sends nothing."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        try:
            sock.connect(path)
            pid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))[0]
        except OSError:  # a full queue (EAGAIN), refused, gone
            return None
    import psutil  # noqa: PLC0415 - only a node that does not answer pays for it

    try:
        status = psutil.Process(pid).status()
    except psutil.Error:
        return None
    return Listener(pid, status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP))
