"""Who may use the control API, and who they are.

- On the Unix socket (mode 0600) the kernel names the peer (``SO_PEERCRED``,
  socket(7)); a peer whose uid is neither the node's nor root's is refused
  (403). The identity is ``uid=N(name)``.
- On TCP every request needs ``Authorization: Bearer <secret>`` (RFC 6750)
  of a named token, sent once (a second ``Authorization`` header is refused,
  400: tools/api/middleware.py); the identity is ``token=<name> (scope <scope>)``.
  Secrets are generated on first run (``secrets.token_urlsafe``, 256 bits) into
  ``<data_dir>/api-tokens.json``, mode 0600, and compared with
  ``hmac.compare_digest`` against every token, so the time taken does not
  say which one, nor how much of it, matched.
- Each token holds a scope (tools/api/scopes.py: read < infer < operate < control),
  from ``[api] tokens``; a socket peer holds control. :func:`authorize`
  refuses a caller whose scope does not cover the route's (403).
- A TCP address beyond loopback is refused at start unless the config sets
  ``allow_non_loopback`` (and then still needs a token).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import pwd
import re
import secrets
import socket
import stat
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from infervisor.replay.callers import token_credential

from .errors import ApiError, ApiRefusal
from .scopes import SCOPE_ORDER, ApiToken, Scope, default_scope, token_scopes

__all__ = [
    "TOKENS_FILE",
    "ApiConfigError",
    "Caller",
    "Peer",
    "TcpAddress",
    "Tokens",
    "authorize",
    "load_or_create_tokens",
    "parse_tcp",
    "peer_of",
    "valid_token_name",
]

#: The tokens' file in the data directory.
TOKENS_FILE = "api-tokens.json"
#: A token name, matched whole (fullmatch: ``$`` alone would take a trailing newline).
_TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ApiConfigError(ApiError):
    """The ``[api]`` config cannot be used (names the key)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, "bad_config", 400, field)


def valid_token_name(name: str) -> bool:
    """A plain token name: letters, digits, ``.``, ``_``, ``-``, at most 64, not
    starting with punctuation."""
    return _TOKEN_NAME.fullmatch(name) is not None


class Caller(msgspec.Struct, frozen=True):
    """Who sent a request (``identity``, recorded in the event's source) and its scope.

    ``credential`` is what a controller's source names after the controller
    (replay/callers.py ``controller_source``): ``token NAME`` for a bearer token,
    the peer's ``uid=N(name)`` on the Unix socket ("": the identity as it is).
    """

    identity: str
    scope: Scope
    credential: str = ""


def authorize(caller: Caller, needed: Scope, what: str) -> None:
    """Refuse ``caller`` unless its scope covers ``needed`` (``what``: the request).

    Raises:
        ApiRefusal: 403 ``forbidden`` naming the scope needed and the one held.
    """
    if not caller.scope.covers(needed):
        raise ApiRefusal(
            f"{what} needs scope {needed.value}; {caller.identity} holds "
            f"{caller.scope.value} (scopes: {SCOPE_ORDER}; a token's scope "
            "is set in the node's [api] tokens)",
            "forbidden",
            403,
        )


class Peer(msgspec.Struct, frozen=True):
    """A Unix socket peer as the kernel reports it."""

    pid: int
    uid: int
    gid: int

    @property
    def identity(self) -> str:
        """``uid=N(name)`` (``uid=N`` when the uid has no name)."""
        try:
            return f"uid={self.uid}({pwd.getpwuid(self.uid).pw_name})"
        except KeyError:
            return f"uid={self.uid}"

    def check(self, node_uid: int) -> None:
        """Refuse a peer that is neither the node's user nor root.

        Raises:
            ApiRefusal: 403 ``forbidden``.
        """
        if self.uid not in (node_uid, 0):
            raise ApiRefusal(
                f"{self.identity} may not use this node's socket: only uid {node_uid} "
                "(the node's user) and root may; use TCP with a token instead",
                "forbidden",
                403,
            )


def peer_of(sock: socket.socket) -> Peer | None:
    """The peer of a connected Unix socket (None for any other socket)."""
    if sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


class TcpAddress(msgspec.Struct, frozen=True):
    """A TCP listen address; ``loopback`` when only this machine can reach it."""

    host: str
    port: int

    @property
    def loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 and ``localhost``."""
        if self.host == "localhost":
            return True
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def url(self) -> str:
        """``http://host:port`` (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def parse_tcp(value: str, *, allow_non_loopback: bool, key: str = "api.tcp") -> TcpAddress:
    """Read a TCP listen address (``HOST:PORT``, IPv6 as ``[::1]:PORT``) of the
    config key ``key`` (``api.tcp``, ``front.listen``), named in every error.

    Raises:
        ApiConfigError: not HOST:PORT, a port outside 1-65535, or beyond
            loopback without ``allow_non_loopback`` (of the same section).
    """
    host, sep, port_text = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ApiConfigError(
            f"{key} {value!r}: expected HOST:PORT with a port in 1-65535, "
            "e.g. 127.0.0.1:8711 or [::1]:8711",
            key,
        )
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError as e:
            raise ApiConfigError(
                f"{key} {value!r}: the host must be an IP address or localhost", key
            ) from e
    address = TcpAddress(host, int(port_text))
    if not address.loopback and not allow_non_loopback:
        section = key.partition(".")[0]
        raise ApiConfigError(
            f"{key} {value!r} is reachable beyond this machine; bind 127.0.0.1 or ::1, "
            f"or set {section}.allow_non_loopback = true (every request still needs a token)",
            key,
        )
    return address


class Tokens:
    """Named bearer tokens and their scopes; :meth:`identify` names the caller of a secret."""

    def __init__(self, secrets_by_name: dict[str, str], scopes: Mapping[str, Scope]) -> None:
        self._by_name = {name: secret.encode() for name, secret in secrets_by_name.items()}
        self._scopes = {name: scopes.get(name, default_scope(name)) for name in secrets_by_name}

    @property
    def names(self) -> list[str]:
        """The token names, sorted."""
        return sorted(self._by_name)

    def identify(self, authorization: str | None) -> Caller:
        """The caller of an ``Authorization: Bearer <secret>`` header value:
        identity ``token=<name> (scope <scope>)`` and the token's scope.

        Raises:
            ApiRefusal: 401 ``unauthorized``: no header, not Bearer, or an unknown secret.
        """
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiRefusal(
                "this listener needs a bearer token: send 'Authorization: Bearer <secret>' "
                f"(the secrets are in the node's {TOKENS_FILE})",
                "unauthorized",
                401,
            )
        given = secret.strip().encode()
        found = None
        for name, known in self._by_name.items():  # every one: the time says nothing
            if hmac.compare_digest(given, known):
                found = name
        if found is None:
            raise ApiRefusal("the bearer token is not one of this node's", "unauthorized", 401)
        scope = self._scopes[found]
        identity = f"token={found} (scope {scope.value})"
        return Caller(identity=identity, scope=scope, credential=token_credential(found))


def load_or_create_tokens(data_dir: Path, tokens: Iterable[str | ApiToken]) -> Tokens:
    """The data directory's tokens with their scopes (``[api] tokens``: a bare name
    has :func:`~.scopes.default_scope`); names missing from the file are generated.

    The file (name -> secret) is written aside and renamed, mode 0600 from its creation.

    Raises:
        ApiConfigError: a bad token name, or the file is unreadable or not a JSON
            object of strings.
    """
    scopes = token_scopes(tokens)
    for name in scopes:
        if not valid_token_name(name):
            raise ApiConfigError(
                f"api.tokens: {name!r} is not a plain token name (letters, digits, '.', "
                "'_', '-'; at most 64 characters)",
                "api.tokens",
            )
    path = data_dir / TOKENS_FILE
    known = _read_tokens(path)
    missing = [n for n in scopes if n not in known]
    if missing:
        known.update({n: secrets.token_urlsafe(32) for n in missing})
        _write_tokens(path, known)
    return Tokens({n: known[n] for n in scopes}, scopes)


def _read_tokens(path: Path) -> dict[str, str]:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ApiConfigError(f"cannot read the tokens file {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(mode) or mode & 0o077:
        raise ApiConfigError(
            f"the tokens file {path} is not a regular file of mode 0600 (it is "
            f"{'not a regular file' if not stat.S_ISREG(mode) else oct(mode & 0o777)}): "
            f"its secrets may have been read; `chmod 600 {path}` if it is yours, or remove "
            "it (new secrets are generated at the next start)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ApiConfigError(f"cannot read the tokens file {path}: {e}") from e
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ApiConfigError(f"{path}: expected a JSON object of token name -> secret")
    return raw


def _write_tokens(path: Path, tokens: dict[str, str]) -> None:
    """Write aside (0600 from its creation, never through a link), fsync, rename, fsync
    the folder: a crash leaves the old file or the new one, whole.

    Raises:
        ApiConfigError: the file cannot be written (names it and why).
    """
    aside = path.with_name(path.name + ".new")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        aside.unlink(missing_ok=True)  # a crashed write's leftover: never reused
        fd = os.open(aside, flags, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(tokens, out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(aside, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as e:
        raise ApiConfigError(f"cannot write the tokens file {path}: {e.strerror or e}") from e
