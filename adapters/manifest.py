"""The model manifest: one TOML file per model in the registry root.

Source of the behaviour: ``reference/infer_runtime.rs.txt`` (a managed
instance names a registry model; its manifest gives the format and the
weights, and unknown fields are refused). The file format is documented in
:mod:`.registry`.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import msgspec

from .errors import RegistryError
from .spec import valid_token

__all__ = ["ModelEntry", "ModelFormat", "check_entry", "to_toml"]

_HEX64 = re.compile(r"[0-9a-f]{64}")


class ModelFormat(enum.StrEnum):
    """How a model's weights are stored: a GGUF file, an MLX directory, an Ollama tag."""

    GGUF = "gguf"
    MLX = "mlx"
    OLLAMA = "ollama"


class ModelEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One manifest, as written. ``size_bytes`` in bytes; ``blake3`` lowercase hex."""

    name: str
    format: ModelFormat
    path: str = ""
    size_bytes: int = 0
    blake3: str = ""
    ollama_tag: str | None = None
    draft: str | None = None

    @property
    def tag(self) -> str:
        """What Ollama calls the model: ``ollama_tag``, else the name."""
        return self.ollama_tag or self.name


def _toml_str(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_toml(entry: ModelEntry) -> str:
    """The manifest text for ``entry`` (defaults and empty fields left out)."""
    values: dict[str, Any] = msgspec.structs.asdict(entry)
    lines = []
    for key, value in values.items():
        if value is None or (key != "name" and value in ("", 0)):
            continue
        text = str(value) if isinstance(value, int) else _toml_str(str(value))
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


def check_entry(entry: ModelEntry, where: str) -> None:
    """The rules a manifest must follow beyond its types.

    Raises:
        RegistryError: naming the field, its value and what is allowed.
    """
    if entry.draft is not None and (not valid_token(entry.draft) or entry.draft == entry.name):
        raise RegistryError(f"{where}: draft {entry.draft!r} must name another registry model")
    if entry.format is ModelFormat.OLLAMA:
        if entry.path:
            raise RegistryError(f"{where}: an ollama model has no path (Ollama keeps its weights)")
        return
    if entry.ollama_tag is not None:
        raise RegistryError(f"{where}: ollama_tag applies to format 'ollama' only")
    if not entry.path:
        raise RegistryError(f"{where}: path is required for format {entry.format.value!r}")
    if entry.size_bytes <= 0:
        raise RegistryError(
            f"{where}: size_bytes {entry.size_bytes} must be the size in bytes (> 0)"
        )
    if not _HEX64.fullmatch(entry.blake3):
        raise RegistryError(f"{where}: blake3 {entry.blake3!r} must be 64 lowercase hex digits")
