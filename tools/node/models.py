"""The configured models ([[models]]) put in the node's registry before it opens.

A tiny model is generated when asked (``generate_tiny``, the llamacpp extra);
a name already registered must name the same weights, or the run is refused.
"""

from __future__ import annotations

from infervisor.adapters.errors import RegistryError
from infervisor.adapters.registry import ModelFormat, ModelRegistry

from .config import ModelEntryConfig
from .lock import RunError

__all__ = ["register_models"]


def register_models(registry: ModelRegistry, models: list[ModelEntryConfig]) -> None:
    """Make sure every configured model is in the registry (generating tiny ones if asked).

    Raises:
        RunError: a file is missing or not a model, or the tiny model cannot be generated.
    """
    for model in models:
        try:
            _register(registry, model)
        except RegistryError as e:
            raise RunError(f"[[models]] {model.name}: {e}") from e
        except ImportError as e:
            raise RunError(
                f"[[models]] {model.name}: generate_tiny needs the llamacpp extra "
                f"(pip install 'infervisor[llamacpp]'): {e}"
            ) from e
        except OSError as e:
            raise RunError(f"[[models]] {model.name}: {e}") from e


def _register(registry: ModelRegistry, model: ModelEntryConfig) -> None:
    file = registry.root / model.path
    root = registry.root.resolve()
    if model.generate_tiny and not file.resolve().is_relative_to(root):
        raise RegistryError(
            f"path {model.path!r} is outside the registry root {root}: refused before writing"
        )
    if model.generate_tiny and not file.exists():
        from ..servers.tinymodel import generate_tiny_gguf  # noqa: PLC0415 - needs the llamacpp extra

        file.parent.mkdir(parents=True, exist_ok=True)
        generate_tiny_gguf(file)
    if model.name in registry.names():
        _check_same(registry, model)
    else:
        registry.adopt(
            model.name,
            None if model.format is ModelFormat.OLLAMA else file,
            format=model.format,
            ollama_tag=model.ollama_tag,
            draft=model.draft,
        )


def _check_same(registry: ModelRegistry, model: ModelEntryConfig) -> None:
    """A configured model already registered must name the same weights: a
    registration is never silently kept over a config that says otherwise.

    Raises:
        RegistryError: the path, format or Ollama tag differ (names both and how
            to re-register).
    """
    entry = registry.entry(model.name)
    manifest = registry.root / f"{model.name}.toml"
    wanted = registry.root / model.path if model.path else None
    held = registry.root / entry.path if entry.path else None
    same_path = (wanted.resolve() if wanted else None) == (held.resolve() if held else None)
    differs = [
        what
        for what, same in (
            (f"path {model.path!r} (registered: {entry.path!r})", same_path),
            (f"format {model.format.value} (registered: {entry.format.value})",
             model.format is entry.format),
            (f"ollama_tag {model.ollama_tag!r} (registered: {entry.ollama_tag!r})",
             model.ollama_tag == entry.ollama_tag),
        )
        if not same
    ]  # fmt: skip
    if differs:
        raise RegistryError(
            f"the config gives {'; '.join(differs)}, but the name is already registered "
            f"in {manifest}: to register the new weights under this name, stop the node, "
            "remove that manifest (the weights are measured again at the next start), or "
            "give the new weights another name"
        )
