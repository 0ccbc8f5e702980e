"""The control server: ``<data_dir>/control.sock`` of a running node.

The protocol and its errors are in :mod:`.control`. One thread per
connection (``socketserver``) reads request lines and calls the
:class:`~infervisor.actors.node.Node`; a gate decides which verbs the node
takes: none while it opens, all once it is open, only those that change
nothing once the shutdown begins. The shutdown waits for the changing verbs
that already run, so none of them acts after the node stopped its servers.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import pwd
import socket
import socketserver
import stat
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pykka

from infervisor.actors.errors import NodeError
from infervisor.actors.node import Node
from infervisor.adapters.errors import AdapterError
from infervisor.replay.callers import source_for

from .control import (
    CHANGES,
    MAX_LINE,
    VERBS,
    BadRequest,
    ControlError,
    DeepHealthVerb,
    Failed,
    LedgerVerb,
    ListVerb,
    NodeStarting,
    NodeStopping,
    Ok,
    Request,
    RestartVerb,
    StartVerb,
    StatusVerb,
    StopVerb,
    UnloadVerb,
    check_socket_path,
    socket_path,
)
from .exit_codes import cut

__all__ = ["ControlServer"]

log = logging.getLogger(__name__)


class _Phase(enum.Enum):
    STARTING = "starting"
    OPEN = "open"
    STOPPING = "stopping"


class _Gate:
    """Which verbs the node takes now; counts verbs that change state while they run."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._phase = _Phase.STARTING
        self._node: Node | None = None
        self._changing = 0

    def open(self, node: Node) -> None:
        with self._cond:
            self._node, self._phase = node, _Phase.OPEN

    def stopping(self) -> None:
        with self._cond:
            self._phase = _Phase.STOPPING
            self._cond.wait_for(lambda: self._changing == 0)

    @property
    def phase(self) -> _Phase:
        return self._phase

    @contextlib.contextmanager
    def admit(self, changes: bool) -> Iterator[Node]:
        with self._cond:
            if self._node is None:
                raise NodeStarting("the node is starting (resuming from its chain); try again")
            if changes and self._phase is not _Phase.OPEN:
                raise NodeStopping("the node is shutting down; it takes no more verbs")
            node = self._node
            self._changing += int(changes)
        try:
            yield node
        finally:
            if changes:
                with self._cond:
                    self._changing -= 1
                    self._cond.notify_all()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, control: ControlServer) -> None:
        self.control = control
        super().__init__(str(path), _Handler)

    def server_bind(self) -> None:
        super().server_bind()
        os.chmod(self.control.path, 0o600)  # before listen(): nobody connects earlier

    def process_request(self, request: Any, client_address: Any) -> None:
        self.control.track(request, add=True)  # on the accepting thread: close() sees it
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.control.track(request, add=False)
        super().shutdown_request(request)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        control = self.server.control
        caller = peer_identity(self.connection)
        try:
            while line := self.rfile.readline(MAX_LINE + 1):
                if len(line) > MAX_LINE:
                    too_long = BadRequest(f"a request line is at most {MAX_LINE} bytes")
                    self.wfile.write(control.refuse(too_long))
                    return
                self.wfile.write(control.answer(line, caller=caller))
        except OSError:
            return  # the client went away, or the server closed the connection


class ControlServer:
    """Serves operator verbs on ``<data_dir>/control.sock``, a thread per connection.

    Use :meth:`listen`; :meth:`serve` once the node is open; :meth:`stopping`
    before shutting the node down; :meth:`close` (or ``with``) at the end.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._gate = _Gate()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Request)

    @classmethod
    def listen(cls, data_dir: Path | str) -> ControlServer:
        """Bind the socket (mode 0600) and answer ``NodeStarting`` until :meth:`serve`.

        Raises:
            ControlError: the path is too long, is something other than a socket,
                or cannot be bound.
        """
        server = cls(socket_path(data_dir))
        check_socket_path(server.path)
        _remove_stale(server.path)
        try:
            server._server = _Server(server.path, server)
        except OSError as e:
            raise ControlError(f"cannot listen on {server.path}: {e.strerror or e}") from e
        server._thread = threading.Thread(
            target=server._server.serve_forever, args=(0.1,), name="infervisor-control"
        )
        server._thread.start()
        return server

    def serve(self, node: Node) -> None:
        """Take verbs for ``node`` from now on."""
        self._gate.open(node)

    def stopping(self) -> None:
        """Refuse verbs that change state from now on; return once none is running.

        Blocks as long as such a verb runs (the node bounds each one).
        """
        self._gate.stopping()

    def close(self) -> None:
        """Stop listening, end every connection and remove the socket (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        server.server_close()  # joins the connection threads
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> ControlServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ one request
    def track(self, conn: socket.socket, *, add: bool) -> None:
        """Remember an open connection (``add``) or forget a closed one."""
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def answer(self, line: bytes, *, caller: str | None = None) -> bytes:
        """The answer line (``\\n``-terminated) to one request line; never raises.

        ``caller`` is the peer's identity (:func:`peer_identity`); the events a
        verb causes are recorded with source ``operator:<caller>``.
        """
        try:
            request = self._decoder.decode(line)
        except msgspec.DecodeError as e:
            return self.refuse(BadRequest(_explain(e)))
        try:
            return self._encoder.encode(Ok(result=self._dispatch(request, caller))) + b"\n"
        except (NodeError, AdapterError, ControlError) as e:
            return self.refuse(e)
        except pykka.ActorDeadError as e:
            if self._gate.phase is not _Phase.OPEN:
                return self.refuse(NodeStopping("the node shut down before answering"))
            e.args = ("the instance's actor ended during the verb (unloaded meanwhile?)",)
            return self.refuse(e)
        except pykka.Timeout as e:
            e.args = (
                f"an actor of the node did not answer in time ({e}); the verb may still complete",
            )
            return self.refuse(e)
        except Exception as e:  # a bug: answer it rather than drop the connection
            log.exception("control: %s failed", type(request).__name__)
            return self.refuse(e)

    def refuse(self, error: Exception) -> bytes:
        """The answer line for ``error``: its message (long values cut) and class name."""
        failed = Failed(error=cut(str(error)), kind=type(error).__name__)
        return self._encoder.encode(failed) + b"\n"

    def _dispatch(self, request: Request, caller: str | None) -> Any:
        by = source_for("operator", caller)
        with self._gate.admit(isinstance(request, CHANGES)) as node:
            match request:
                case ListVerb():
                    return node.list()
                case StatusVerb(instance=iid):
                    return node.status(iid)
                case StartVerb(instance=iid):
                    return node.start(iid, by=by)
                case StopVerb(instance=iid, grace_s=grace):
                    return node.stop(iid, grace_s=grace, by=by)
                case RestartVerb(instance=iid):
                    return node.restart(iid, by=by)
                case UnloadVerb(instance=iid):
                    return node.unload(iid, by=by)
                case DeepHealthVerb(instance=iid):
                    return node.deep_health(iid)
                case LedgerVerb():
                    return node.ledger()
        raise BadRequest(f"unknown request {request!r}")  # pragma: no cover - the union is closed


def peer_identity(conn: socket.socket) -> str | None:
    """``uid=N(name)`` of the process at the other end of a Unix socket, or None.

    From ``SO_PEERCRED`` (socket(7)): the kernel's record of the peer, which the
    peer cannot forge. None where the option is unavailable.
    """
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError):
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid={uid}"
    return f"uid={uid}({name})"


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _explain(error: msgspec.DecodeError) -> str:
    """A request that does not decode: what is wrong, and what a request looks like."""
    message = str(error)
    if " - at `$." in message and "`$.verb`" not in message:
        return message  # a known verb with a bad field: msgspec names the field
    return f'{message}; send one JSON object per line: {{"verb": one of {VERBS}, ...}}'


def _remove_stale(path: Path) -> None:
    """Remove the socket a crashed node left; refuse anything else at that path."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise ControlError(f"cannot check {path}: {e.strerror or e}") from e
    if not stat.S_ISSOCK(mode):
        raise ControlError(f"{path} exists and is not a socket; move it away")
    try:
        path.unlink()
    except OSError as e:
        raise ControlError(f"cannot remove the stale {path}: {e.strerror or e}") from e
