"""What a node's config and an operator's spec fragment share, and no more: reading
a TOML document (:func:`read_toml`, :func:`parse_toml`) and an ``[[instances]]``
entry (:class:`InstanceEntry`).

``infervisor place --file`` and ``fleet place`` read a fragment with these
alone: the rest of the config (tools/node/config.py) imports the node's
actors and adapters, 0.1 s of CPU at each such command for a file that holds
one instance's keys.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from infervisor.adapters.spec import InstanceSpec

__all__ = ["MAX_TOML_DEPTH", "ConfigError", "InstanceEntry", "parse_toml", "read_toml"]


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


class InstanceEntry(InstanceSpec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An instance spec plus ``start``: wanted running when first placed."""

    start: bool = True

    def spec(self) -> InstanceSpec:
        """The spec without the config-only fields."""
        fields = msgspec.structs.asdict(self)
        fields.pop("start")
        return InstanceSpec(**fields)


MAX_TOML_DEPTH = 16
"""Deepest nesting of tables and arrays a config or spec fragment may have
(the deepest key of a valid config is 4 levels down: ``[node.kinds.<name>.restart]``)."""


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document in ``path``: a config file or a ``--file`` spec fragment.

    Raises:
        ConfigError: one line naming the file: unreadable, not UTF-8 text, not
            TOML, or nested deeper than :data:`MAX_TOML_DEPTH` (tomllib raises
            RecursionError on a few thousand levels; that is caught here too).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a text file: {e}") from e
    return parse_toml(text, str(path))


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``text`` parsed as TOML; ``where`` (the file) starts the error message.

    Raises:
        ConfigError: not TOML, or nested deeper than :data:`MAX_TOML_DEPTH`.
    """
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from e
    except RecursionError:
        raise ConfigError(f"{where}: not valid TOML: {_TOO_DEEP}") from None
    if _depth(raw) > MAX_TOML_DEPTH:
        raise ConfigError(f"{where}: not valid TOML: {_TOO_DEEP}")
    return raw


_TOO_DEEP = f"tables or arrays nested more than {MAX_TOML_DEPTH} levels deep"


def _depth(value: object) -> int:
    """Nesting depth of ``value`` (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        children: Iterable[object] = ()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        stack.extend((child, level + 1) for child in children)
        deepest = max(deepest, level)
        if deepest > MAX_TOML_DEPTH:
            break
    return deepest
