"""The control socket's protocol and client: operator verbs against a running node.

``infervisor run`` listens on ``<data_dir>/control.sock`` (mode 0600;
:mod:`.control_server`) from the moment it holds the data_dir's run lock
until the node is shut down, then removes it. A socket file left by a node
that crashed is replaced: the run lock already guarantees that no other
node uses it.

Protocol: one JSON object per line each way (UTF-8, ``\\n``-terminated), any
number of requests per connection, answered in order::

    {"verb": "list"}                                  -> [InstanceView, ...]
    {"verb": "status", "instance": ID}                -> InstanceView
    {"verb": "start" | "restart", "instance": ID}     -> InstanceView
    {"verb": "stop", "instance": ID, "grace_s": 5.0}  -> InstanceView (grace_s optional)
    {"verb": "unload", "instance": ID}                -> null
    {"verb": "deep_health", "instance": ID}           -> the token (string)
    {"verb": "ledger"}                                -> LedgerView or null (no budget)

    {"ok": true, "result": ...}
    {"ok": false, "error": "<the exception message>", "kind": "<exception class name>"}

Verbs are the :class:`~infervisor.actors.node.Node` methods, sent
``by="operator"``. While the node opens, every verb is answered
``NodeStarting``; once its shutdown begins, verbs that change state are
answered ``NodeStopping`` (and the shutdown waits for those already
running). The errors (``BadRequest``, ``NodeStarting`` and ``NodeStopping``
travel as ``kind``)::

    ControlError
     +-- NodeUnavailable    no node takes verbs on that data_dir (also a ConnectionError)
     |    +-- NotRunning    no control socket, or nothing listens on it
     |    +-- NodeStarting  the node is opening (resuming from its chain)
     |    +-- NodeStopping  the node is shutting down, or went away mid-answer
     +-- VerbFailed         the node refused or failed the verb; ``kind`` names its error
     +-- BadRequest         a request line the server cannot read (server side)
"""

from __future__ import annotations

import builtins
import io
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import msgspec

from infervisor.actors.ledger import LedgerView
from infervisor.actors.messages import InstanceView

__all__ = [
    "CHANGES",
    "MAX_LINE",
    "SOCKET_FILE",
    "VERBS",
    "Answer",
    "BadRequest",
    "ControlClient",
    "ControlError",
    "DeepHealthVerb",
    "Failed",
    "LedgerVerb",
    "ListVerb",
    "NodeStarting",
    "NodeStopping",
    "NodeUnavailable",
    "NotRunning",
    "Ok",
    "Request",
    "RestartVerb",
    "StartVerb",
    "StatusVerb",
    "StopVerb",
    "UnloadVerb",
    "VerbFailed",
    "check_socket_path",
    "socket_path",
]

#: The socket's name in the data_dir.
SOCKET_FILE = "control.sock"
#: Longest request line, bytes: a request is a verb and an instance id.
MAX_LINE = 64 * 1024
#: sun_path holds 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107


# ---------------------------------------------------------------- errors
class ControlError(Exception):
    """Base of the control socket's errors."""


class NodeUnavailable(ControlError, ConnectionError):
    """No node takes verbs on the data_dir now."""


class NotRunning(NodeUnavailable):
    """No node runs on the data_dir (no control socket, or nothing listens on it)."""


class NodeStarting(NodeUnavailable):
    """The node holds the data_dir but is still opening."""


class NodeStopping(NodeUnavailable):
    """The node is shutting down."""


class VerbFailed(ControlError):
    """The node refused or failed the verb; ``kind`` is the class name of its error."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class BadRequest(ControlError):
    """A request line that is not one of the protocol's requests."""


# ---------------------------------------------------------------- protocol
class _Verb(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, tag_field="verb"
):
    pass


class _InstanceVerb(_Verb, frozen=True):
    instance: str


class ListVerb(_Verb, frozen=True, tag="list"):
    """Every instance's view, ordered by id."""


class StatusVerb(_InstanceVerb, frozen=True, tag="status"):
    """One instance's view."""


class StartVerb(_InstanceVerb, frozen=True, tag="start"):
    """Start the server (resets the restart budget)."""


class StopVerb(_InstanceVerb, frozen=True, tag="stop"):
    """Stop the server; SIGKILL ``grace_s`` seconds after SIGTERM (the node's default if None)."""

    grace_s: Annotated[float, msgspec.Meta(ge=0)] | None = None


class RestartVerb(_InstanceVerb, frozen=True, tag="restart"):
    """Stop (when running), then start."""


class UnloadVerb(_InstanceVerb, frozen=True, tag="unload"):
    """Stop the server and forget the instance."""


class DeepHealthVerb(_InstanceVerb, frozen=True, tag="deep_health"):
    """Probe plus one real token."""


class LedgerVerb(_Verb, frozen=True, tag="ledger"):
    """The memory budget and each reservation."""


Request = (
    ListVerb
    | StatusVerb
    | StartVerb
    | StopVerb
    | RestartVerb
    | UnloadVerb
    | DeepHealthVerb
    | LedgerVerb
)
VERBS = "list, status, start, stop, restart, unload, deep_health, ledger"
CHANGES = (StartVerb, StopVerb, RestartVerb, UnloadVerb)


class Ok(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a verb that succeeded."""

    ok: bool = True
    result: Any


class Failed(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a verb that was refused or failed."""

    ok: bool = False
    error: str
    kind: str


class Answer(msgspec.Struct, frozen=True):
    """Either answer, as a client reads it (``result`` left undecoded)."""

    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: str = ""
    kind: str = ""


def socket_path(data_dir: Path | str) -> Path:
    """The control socket of the node on ``data_dir``."""
    return Path(data_dir) / SOCKET_FILE


def check_socket_path(path: Path) -> None:
    """Raise ControlError when ``path`` is too long to bind a Unix socket to."""
    size = len(os.fsencode(path))
    if size > _MAX_SOCKET_PATH:
        raise ControlError(
            f"the control socket {path} would be {size} bytes long; a Unix socket path "
            f"holds at most {_MAX_SOCKET_PATH}: use a shorter data_dir"
        )


# ---------------------------------------------------------------- client
class ControlClient:
    """Talks to the node on ``data_dir`` over one connection (opened on first use).

    Every verb blocks until the node answers; the node bounds each verb (a
    stop: its grace plus 30 s). ``timeout_s`` bounds each answer as well.

    Raises (every verb):
        NotRunning: no node runs on ``data_dir``.
        NodeStarting, NodeStopping: the node does not take the verb now.
        VerbFailed: the node refused or failed it, with its message.
    """

    def __init__(self, data_dir: Path | str, *, timeout_s: float | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.path = socket_path(data_dir)
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._reader: io.BufferedReader | None = None
        self._decoder = msgspec.json.Decoder(Answer)

    def connect(self) -> None:
        """Open the connection now (verbs open it when needed)."""
        if self._sock is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(str(self.path))
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError) as e:
            sock.close()
            raise NotRunning(
                f"no node is running on {self.data_dir} (no control socket); "
                "start one with `infervisor run CONFIG`"
            ) from e
        except OSError as e:
            sock.close()
            raise NodeUnavailable(f"cannot connect to {self.path}: {e.strerror or e}") from e
        self._sock, self._reader = sock, sock.makefile("rb")

    def close(self) -> None:
        """Close the connection (idempotent)."""
        sock, reader, self._sock, self._reader = self._sock, self._reader, None, None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request: Request) -> msgspec.Raw:
        """Send one request; its result, undecoded."""
        self.connect()
        assert self._sock is not None
        assert self._reader is not None
        try:
            self._sock.sendall(msgspec.json.encode(request) + b"\n")
            line = self._reader.readline()
        except TimeoutError as e:
            self.close()
            raise NodeUnavailable(f"no answer from {self.path} in {self.timeout_s:g} s") from e
        except OSError as e:
            self.close()
            raise NodeStopping(f"the node on {self.data_dir} went away: {e.strerror or e}") from e
        if not line:
            self.close()
            raise NodeStopping(f"the node on {self.data_dir} closed the connection (stopped?)")
        try:
            answer = self._decoder.decode(line)
        except msgspec.DecodeError as e:
            raise ControlError(f"the node's answer is not understood: {e}: {line!r}") from e
        if answer.ok:
            return answer.result
        unavailable = _UNAVAILABLE.get(answer.kind)
        if unavailable is not None:
            raise unavailable(answer.error)
        raise VerbFailed(answer.error, answer.kind)

    # ------------------------------------------------------------ typed verbs
    def list(self) -> builtins.list[InstanceView]:
        """Every instance's view, ordered by id."""
        views: builtins.list[InstanceView] = _decode(
            self.call(ListVerb()), builtins.list[InstanceView]
        )
        return views

    def status(self, instance: str) -> InstanceView:
        """One instance's view."""
        return _view(self.call(StatusVerb(instance=instance)))

    def start(self, instance: str) -> InstanceView:
        """Start the server (resets the restart budget)."""
        return _view(self.call(StartVerb(instance=instance)))

    def stop(self, instance: str, grace_s: float | None = None) -> InstanceView:
        """Stop the server; the answer comes once nothing of it is left."""
        return _view(self.call(StopVerb(instance=instance, grace_s=grace_s)))

    def restart(self, instance: str) -> InstanceView:
        """Stop (when running), then start."""
        return _view(self.call(RestartVerb(instance=instance)))

    def unload(self, instance: str) -> None:
        """Stop the server and forget the instance."""
        self.call(UnloadVerb(instance=instance))

    def deep_health(self, instance: str) -> str:
        """The one token the server produced."""
        token: str = _decode(self.call(DeepHealthVerb(instance=instance)), str)
        return token

    def ledger(self) -> LedgerView | None:
        """The memory budget and reservations (None when the node has no budget)."""
        ledger: LedgerView | None = _decode(self.call(LedgerVerb()), LedgerView | None)
        return ledger


_UNAVAILABLE: dict[str, type[NodeUnavailable]] = {
    "NodeStarting": NodeStarting,
    "NodeStopping": NodeStopping,
}


def _view(raw: msgspec.Raw) -> InstanceView:
    view: InstanceView = _decode(raw, InstanceView)
    return view


def _decode(raw: bytes | msgspec.Raw, type_: Any) -> Any:
    """A result of the node's, typed; an answer this client does not understand (a
    node of another version) is a ControlError, not a traceback."""
    try:
        return msgspec.json.decode(raw, type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ControlError(f"the node's answer is not understood (another version?): {e}") from e
