"""The node's TOML configuration: one typed object, unknown keys refused.

Shape (see ``examples/node.toml``)::

    [node]                 # NodeSettings: node_id, data_dir, intervals, [node.restart] ...
    [[models]]             # registered into the model registry at start
    [[instances]]          # InstanceSpec fields, plus `start` (wanted running when first placed)

Relative paths are resolved against the config file's folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from infervisor.actors.settings import NodeSettings
from infervisor.adapters.registry import ModelFormat
from infervisor.adapters.spec import InstanceSpec

__all__ = ["ConfigError", "InstanceEntry", "ModelEntryConfig", "NodeConfig", "load_config"]


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


class ModelEntryConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model to register. ``path`` is relative to the registry folder.

    ``generate_tiny`` creates the project's tiny random-weight GGUF there when
    the file is missing (for examples and tests; it produces no useful text).
    """

    name: str
    path: str
    format: ModelFormat = ModelFormat.GGUF
    generate_tiny: bool = False
    ollama_tag: str | None = None
    draft: str | None = None


class InstanceEntry(InstanceSpec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An instance spec plus ``start``: wanted running when first placed."""

    start: bool = True

    def spec(self) -> InstanceSpec:
        """The spec without the config-only fields."""
        fields = msgspec.structs.asdict(self)
        fields.pop("start")
        return InstanceSpec(**fields)


class NodeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole file."""

    node: NodeSettings
    models: list[ModelEntryConfig] = msgspec.field(default_factory=list)
    instances: list[InstanceEntry] = msgspec.field(default_factory=list)


def load_config(path: Path) -> NodeConfig:
    """Read and check a config file, resolving relative paths.

    Raises:
        ConfigError: unreadable, not TOML, an unknown or mistyped key (named
            with its location), or a value out of range.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    try:
        config = msgspec.convert(raw, NodeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path}: {_explain(str(e))}") from e
    config = _resolve_paths(config, path.parent)
    _check(config, path)
    return config


def _explain(message: str) -> str:
    # msgspec says "Object contains unknown field `x` - at `$.node`"; operators read TOML keys.
    return message.replace("Object contains unknown field", "unknown key").replace("$.", "")


def _resolve_paths(config: NodeConfig, base: Path) -> NodeConfig:
    node = config.node
    data_dir = str((base / node.data_dir).resolve())
    registry = str((base / node.registry_dir).resolve()) if node.registry_dir else None
    node = msgspec.structs.replace(node, data_dir=data_dir, registry_dir=registry)
    return msgspec.structs.replace(config, node=node)


def _check(config: NodeConfig, path: Path) -> None:
    try:
        config.node.validate()
        for entry in config.instances:
            entry.spec().validate()
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from e
    names = [m.name for m in config.models]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(
            f"{path}: model names must be unique; repeated: {', '.join(sorted(dupes))}"
        )
