"""The witness's TOML config and its cosigner key.

Shape (see ``examples/witness.toml``)::

    [witness]
    name = "witness.example/w1"       # its key name (a schema-less URL is recommended)
    listen = "127.0.0.1:7380"         # HOST:PORT it serves add-checkpoint on
    data_dir = "witness-data"         # witness.key, witness.vkey, witness.db
    read_timeout_s = 10               # for a request head, then for its body
    max_connections = 256
    audit = false                     # true: as `run --audit` (read the events first)

    [[logs]]                          # one per log it witnesses
    origin = "example.com/log42"      # the checkpoint's first line
    vkey = "example.com/log42+1a2b3c4d+AX..."  # the log's note verifier key (or a list)
    url = "https://node.example:7070" # where --audit fetches the log (optional)
    token_file = "tokens/log42"       # a read token for url (optional)

Relative paths are resolved against the config file's folder. The key lives
in the data directory: ``witness.key`` (``PRIVATE+KEY+<name>+<id>+<base64>``,
mode 0600, created on first use) and ``witness.vkey`` (its verifier key, for
the logs' ``[[witnesses]] vkey``).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import msgspec

from infervisor.chain.cosignature import Cosigner, parse_cosigner_key
from infervisor.chain.errors import NoteError
from infervisor.chain.note import Verifier, check_key_name, parse_verifier_key

from ..netkit.bearer import token_problem

__all__ = [
    "KEY_FILE",
    "VKEY_FILE",
    "ConfigError",
    "WitnessConfig",
    "WitnessedLog",
    "load_config",
    "load_or_create_cosigner",
    "parse_listen",
    "token_of",
]

KEY_FILE = "witness.key"
VKEY_FILE = "witness.vkey"
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(Exception):
    """The config or the key cannot be used; the message names the file and the key."""


class _Witness(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    data_dir: str
    listen: str = "127.0.0.1:7380"
    read_timeout_s: float = 10.0
    max_connections: int = 256
    audit: bool = False


class _Log(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    origin: str
    vkey: str | list[str]
    url: str | None = None
    token_file: str | None = None


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    witness: _Witness
    logs: list[_Log] = []


class WitnessedLog(msgspec.Struct, frozen=True):
    """A log the witness cosigns for.

    Attributes:
        origin: its checkpoints' origin line.
        verifiers: the note keys whose signature it trusts for that origin.
        url: where ``--audit`` fetches the log's events (None: not audited).
        token_file: a file holding a read token for ``url``.
    """

    origin: str
    verifiers: tuple[Verifier, ...]
    url: str | None = None
    token_file: Path | None = None


class WitnessConfig(msgspec.Struct, frozen=True):
    """A witness's settings: name, listen address, data dir, limits, the logs by origin.

    ``audit``: audit each log's events before cosigning (``run --audit``).
    """

    name: str
    host: str
    port: int
    data_dir: Path
    read_timeout_s: float
    max_connections: int
    logs: dict[str, WitnessedLog]
    audit: bool = False


def parse_listen(text: str, where: str = "witness.listen") -> tuple[str, int]:
    """Split ``HOST:PORT`` (an IPv6 host in brackets).

    Raises:
        ConfigError: not HOST:PORT with a port 1 .. 65535.
    """
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} must be HOST:PORT with a port 1 .. 65535, found {text!r}")
    return host, int(port)


def load_config(path: Path) -> WitnessConfig:
    """Read and check a witness config.

    Raises:
        ConfigError: one line naming the file and the key at fault.
    """
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: over {MAX_CONFIG_BYTES} bytes; is it a config?")
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        parsed = msgspec.convert(raw, _File)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not a TOML file: {e}") from e
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
    return _check(parsed, path)


def _check(parsed: _File, path: Path) -> WitnessConfig:
    w = parsed.witness
    try:
        check_key_name(w.name)
    except NoteError as e:
        raise ConfigError(f"{path}: witness.name: {e}") from e
    if not w.data_dir.strip():  # base / "" is the config's own folder (stop 34)
        raise ConfigError(
            f"{path}: witness.data_dir is empty: give a directory (a relative path is from "
            "the config's folder)"
        )
    host, port = parse_listen(w.listen)
    if not 0 < w.read_timeout_s <= 600 or not 1 <= w.max_connections <= 65536:
        raise ConfigError(
            f"{path}: witness.read_timeout_s must be 0 .. 600 and max_connections 1 .. 65536"
        )
    base = path.parent
    logs: dict[str, WitnessedLog] = {}
    for i, log in enumerate(parsed.logs):
        where = f"{path}: logs[{i}]"
        if not log.origin or any(ch.isspace() and ch != " " for ch in log.origin):
            raise ConfigError(f"{where}.origin must be one non-empty line, found {log.origin!r}")
        if log.origin in logs:
            raise ConfigError(f"{where}.origin {log.origin!r} is configured twice")
        keys = [log.vkey] if isinstance(log.vkey, str) else log.vkey
        if not keys:
            raise ConfigError(f"{where}.vkey: give the log's verifier key")
        try:
            verifiers = tuple(parse_verifier_key(k) for k in keys)
        except NoteError as e:
            raise ConfigError(f"{where}.vkey: {e}") from e
        if log.token_file is not None and not log.token_file.strip():
            raise ConfigError(
                f"{where}.token_file is empty: give a file holding a read token, or leave "
                "the key out"
            )
        token = base / log.token_file if log.token_file else None
        _check_source(where, log.url, token)
        logs[log.origin] = WitnessedLog(log.origin, verifiers, log.url, token)
    return WitnessConfig(
        w.name, host, port, base / w.data_dir, w.read_timeout_s, w.max_connections, logs, w.audit
    )


def load_or_create_cosigner(data_dir: Path, name: str) -> Cosigner:
    """The witness key in ``data_dir`` (created, mode 0600, on first use), named ``name``.

    Writes ``witness.vkey`` beside it too.

    Raises:
        ConfigError: the directory or key cannot be made or read, the key is
            not a cosignature/v1 key, or it is named other than ``name``.
    """
    key_path = data_dir / KEY_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not key_path.exists():
            _create_key(key_path, Cosigner.generate(name))
        cosigner = parse_cosigner_key(key_path.read_text(encoding="ascii"))
    except OSError as e:
        raise ConfigError(f"{key_path}: {e.strerror or e}") from e
    except (UnicodeDecodeError, NoteError) as e:
        raise ConfigError(f"{key_path}: not a witness key: {e}") from e
    if cosigner.name != name:
        raise ConfigError(
            f"{key_path} is the key of witness {cosigner.name!r}, the config names "
            f"{name!r}: set witness.name to {cosigner.name!r} or use another data_dir"
        )
    vkey_path = data_dir / VKEY_FILE
    vkey = cosigner.key.key_string() + "\n"
    try:
        if not vkey_path.exists() or vkey_path.read_text(encoding="ascii") != vkey:
            vkey_path.write_text(vkey, encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{vkey_path}: {e}") from e
    return cosigner


def _create_key(path: Path, cosigner: Cosigner) -> None:
    """Write the key durably: a 0600 temporary file, fsynced, linked in place.

    ``link`` never replaces: of two first runs at once, the first key stays.
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (cosigner.key_string() + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_source(where: str, url: str | None, token: Path | None) -> None:
    """A log's url (http, https or file) and token file, checked at start: a typo
    would otherwise be a 503 to every submission, for ever.

    Raises:
        ConfigError: naming the field and what is allowed.
    """
    if url is not None:
        scheme, _, rest = url.partition("://")
        if scheme not in ("http", "https", "file") or not rest:
            raise ConfigError(
                f"{where}.url {url!r}: allowed http://HOST:PORT, https://HOST:PORT or "
                "file:///path/to/chain.db (or a data dir)"
            )
        if scheme == "file" and not Path(rest).exists():
            raise ConfigError(f"{where}.url {url!r}: no such file or directory")
    if token is not None:
        token_of(token, f"{where}.token_file {str(token)!r}")


def token_of(file: Path, where: str) -> str:
    """The read token in ``file``, once an Authorization header can carry it: read
    at start (a token no header can carry would otherwise fail every audit, in the
    HTTP client's words) and at each fetch (tools/witness/audit.py: the file may
    have changed).

    Raises:
        ConfigError: naming ``where`` (the config file, the log, the key): no such
            file, unreadable, or a character a token may not hold
            (tools/netkit/bearer.py).
    """
    try:
        secret = file.read_bytes().decode("utf-8").strip()  # a CR kept: named if inside
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it: {e}") from e
    problem = token_problem(secret)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return secret
