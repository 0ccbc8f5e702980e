"""The fleet's TOML file: which nodes it follows, where its store lives.

Shape (``examples/fleet.toml``)::

    [fleet]
    store = "fleet.db"               # its SQLite store (events, verified checkpoints)
    metrics = "127.0.0.1:9464"       # HOST:PORT `fleet serve` serves /metrics on
    check_interval_s = 10            # how often `fleet serve` checks the checkpoints

    [[nodes]]
    name = "gpu-01"                  # the name the fleet shows (unique)
    url = "http://10.0.0.11:7070"    # the node's API over TCP ([api] tcp)
    token_file = "tokens/gpu-01"     # a read token (or `token = "..."`); the file is the
                                     # bare secret or the node's api-tokens.json
    pub = "keys/gpu-01.pub"          # a copy of the node's node.pub

Relative paths are resolved against the file's folder. A bad entry is
reported in one line naming it and its key (``[[nodes]] #2 url: ...``):
:class:`FleetConfigError`. A token is sent in an ``Authorization`` header, so
one that holds anything but visible ASCII (a control character, CR or LF, a
space) is refused here, by the check every sender of the tools uses
(tools/netkit/bearer.py), not by the HTTP client at the first request.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infervisor.chain.checkpoint import load_verifier
from infervisor.chain.errors import CheckpointError
from infervisor.chain.note import Verifier

from ..netkit.bearer import TokenFileError, token_file_secrets, token_problem

__all__ = [
    "CONTROL_TOKEN_NAMES",
    "TOKEN_NAMES",
    "FleetConfig",
    "FleetConfigError",
    "NodeEntry",
    "load_config",
    "parse_listen",
]

TOKEN_NAMES = ("auditor", "operator", "controller")
"""The token an api-tokens.json ``token_file`` gives to reads, in order of preference
(the least scope first; a node's generated file has operator and controller)."""

CONTROL_TOKEN_NAMES = ("controller", "operator")
"""The token an api-tokens.json ``token_file`` gives to `fleet place` and `fleet drain`."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_URL = re.compile(r"https?://[^\s/]+(:[0-9]{1,5})?/?")
_LISTEN = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):([0-9]{1,5})")
_NODE_KEYS = {"name", "url", "token", "token_file", "pub"}
_FLEET_KEYS = {"store", "metrics", "check_interval_s"}


class FleetConfigError(Exception):
    """The fleet file cannot be used; the message is one line naming the entry and key."""


@dataclass(frozen=True)
class NodeEntry:
    """One ``[[nodes]]`` entry.

    Attributes:
        name: the fleet's name for it (unique in the file).
        url: its API's base URL (``http://HOST:PORT``), without a trailing slash.
        token: the bearer token sent to read (None: none).
        control_token: the one sent to place and drain (the same but from an
            api-tokens.json, where it is its controller's or operator's).
        pub: its checkpoint verifier key (the node.pub copy).
        pub_path: where that key was read.
    """

    name: str
    url: str
    token: str | None
    control_token: str | None
    pub: Verifier
    pub_path: Path


@dataclass(frozen=True)
class FleetConfig:
    """The whole file: the nodes in file order, the store's path, the metrics address."""

    path: Path
    nodes: tuple[NodeEntry, ...]
    store: Path
    metrics: tuple[str, int] | None
    check_interval_s: float

    def node(self, name: str) -> NodeEntry:
        """The entry named `name`.

        Raises:
            FleetConfigError: no such entry (the message lists the names).
        """
        for entry in self.nodes:
            if entry.name == name:
                return entry
        names = ", ".join(e.name for e in self.nodes)
        raise FleetConfigError(f"NODE {name!r} is not in {self.path}; its nodes: {names}")


def load_config(path: Path) -> FleetConfig:
    """Read and check the fleet file at `path`.

    Raises:
        FleetConfigError: unreadable, not TOML, an unknown key, or a bad value
            (one line: ``<file>: [[nodes]] #N KEY: what is wrong, what is allowed``).
    """
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise FleetConfigError(f"{path}: cannot read it: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise FleetConfigError(f"{path}: not TOML: {e}") from e
    base = path.parent
    extra = set(doc) - {"fleet", "nodes"}
    if extra:
        raise FleetConfigError(f"{path}: unknown table {sorted(extra)[0]!r}; allowed: fleet, nodes")
    fleet = _table(doc.get("fleet", {}), "[fleet]", path)
    _no_unknown(fleet, _FLEET_KEYS, "[fleet]", path)
    raw_nodes = doc.get("nodes", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise FleetConfigError(f"{path}: [[nodes]]: at least one node is needed")
    nodes = tuple(_node(raw, i + 1, base, path) for i, raw in enumerate(raw_nodes))
    seen: set[str] = set()
    for i, entry in enumerate(nodes, 1):
        if entry.name in seen:
            raise FleetConfigError(f"{path}: [[nodes]] #{i} name: {entry.name!r} is given twice")
        seen.add(entry.name)
    return FleetConfig(
        path=path,
        nodes=nodes,
        store=base / _text(fleet.get("store", "fleet.db"), "[fleet] store", path),
        metrics=_listen(fleet.get("metrics"), path),
        check_interval_s=_interval(fleet.get("check_interval_s", 10.0), path),
    )


def _table(value: Any, where: str, path: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FleetConfigError(f"{path}: {where}: expected a table")
    return value


def _no_unknown(table: dict[str, Any], allowed: set[str], where: str, path: Path) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise FleetConfigError(
            f"{path}: {where} {extra[0]}: unknown key; allowed: {', '.join(sorted(allowed))}"
        )


def _text(value: Any, where: str, path: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FleetConfigError(f"{path}: {where}: expected a non-empty string, found {value!r}")
    return value


def _node(raw: Any, number: int, base: Path, path: Path) -> NodeEntry:
    where = f"[[nodes]] #{number}"
    table = _table(raw, where, path)
    _no_unknown(table, _NODE_KEYS, where, path)
    for key in ("name", "url", "pub"):
        if key not in table:
            raise FleetConfigError(f"{path}: {where} {key}: missing (needed: name, url, pub)")
    name = _text(table["name"], f"{where} name", path)
    if not _NAME.fullmatch(name):
        raise FleetConfigError(
            f"{path}: {where} name: {name!r} is not letters, digits, '.', '_', '-' (1-64)"
        )
    url = _text(table["url"], f"{where} url", path)
    if not _URL.fullmatch(url):
        raise FleetConfigError(
            f"{path}: {where} url: {url!r} is not a node's API, http://HOST:PORT or https://HOST:PORT"
        )
    token, control = _tokens(table, where, base, path)
    return NodeEntry(
        name=name,
        url=url.rstrip("/"),
        token=token,
        control_token=control,
        pub=_pub(_text(table["pub"], f"{where} pub", path), where, base, path),
        pub_path=base / table["pub"],
    )


def _tokens(
    table: dict[str, Any], where: str, base: Path, path: Path
) -> tuple[str | None, str | None]:
    """The read token and the control token (module doc)."""
    if "token" in table and "token_file" in table:
        raise FleetConfigError(f"{path}: {where} token: give token or token_file, not both")
    if "token" in table:
        token = _text(table["token"], f"{where} token", path).strip()
        return _sendable(token, f"{where} token", path), token
    if "token_file" not in table:
        return None, None
    file = base / _text(table["token_file"], f"{where} token_file", path)
    try:
        # bytes decoded, not read_text: its newline translation would make a CR a line
        tokens = token_file_secrets(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise FleetConfigError(f"{path}: {where} token_file: {file}: cannot read it: {e}") from e
    except TokenFileError as e:  # the command line's own reading (tools/netkit/bearer.py)
        raise FleetConfigError(
            f"{path}: {where} token_file: {file}: {e}; expected the bare secret or the node's "
            'api-tokens.json ({"operator": "..."})'
        ) from e
    if isinstance(tokens, str):
        return tokens, tokens
    read = next((n for n in TOKEN_NAMES if n in tokens), None)
    if read is None:
        raise FleetConfigError(
            f"{path}: {where} token_file: {file} has none of the tokens {', '.join(TOKEN_NAMES)}"
        )
    control = next((n for n in CONTROL_TOKEN_NAMES if n in tokens), read)
    for name in (read, control):
        _sendable(tokens[name], f"{where} token_file: {file}: token {name!r}", path)
    return tokens[read], tokens[control]


def _sendable(token: str, where: str, path: Path) -> str:
    """``token`` when an Authorization header can carry it (tools/netkit/bearer.py).

    Raises:
        FleetConfigError: naming the file, the entry and the key (``where``), and
            what a token may hold.
    """
    problem = token_problem(token)
    if problem is not None:
        raise FleetConfigError(f"{path}: {where}: {problem}")
    return token


def _pub(value: str, where: str, base: Path, path: Path) -> Verifier:
    file = base / value
    if not file.is_file():
        raise FleetConfigError(f"{path}: {where} pub: {file}: no such file (a copy of node.pub)")
    try:
        return load_verifier(file, None, private=False)  # node.key refused, naming node.pub
    except CheckpointError as e:
        raise FleetConfigError(f"{path}: {where} pub: {e}") from e


def _listen(value: Any, path: Path) -> tuple[str, int] | None:
    if value is None:
        return None
    return parse_listen(_text(value, "[fleet] metrics", path), f"{path}: [fleet] metrics")


def parse_listen(text: str, where: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets; port 0: any free port) as (host, port).

    Raises:
        FleetConfigError: naming `where`.
    """
    match = _LISTEN.fullmatch(text)
    if match is None or not 0 <= int(match.group(2)) <= 65535:
        raise FleetConfigError(f"{where}: {text!r} is not HOST:PORT (port 0 to 65535)")
    return match.group(1).strip("[]"), int(match.group(2))


def _interval(value: Any, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.1 <= value <= 86400:
        raise FleetConfigError(
            f"{path}: [fleet] check_interval_s: {value!r}; allowed: seconds, 0.1 to 86400"
        )
    return float(value)
