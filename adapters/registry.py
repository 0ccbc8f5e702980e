"""The model registry: the only source of weight paths.

Source of the behaviour: ``reference/infer_runtime.rs.txt`` (``resolve``,
``check_format``: a managed instance names a registry model, never a path;
its format must fit the flavor; the Ollama tag defaults to the model name).

Each model is a TOML manifest ``<root>/<name>.toml``::

    name = "tiny"            # the file's stem
    format = "gguf"          # "gguf" | "mlx" | "ollama"
    path = "models/tiny.gguf"  # relative to the root; no absolute path, no ".."
    size_bytes = 123456      # of the file (mlx: total of the directory's files)
    blake3 = "<64 hex>"      # see ``digest`` for the MLX directory digest
    ollama_tag = "llama3:8b" # ollama only (default: the name)
    draft = "tiny-draft"     # optional: a draft model for speculative decoding

An Ollama model has no path, size or digest: Ollama holds its own weights.
"""

from __future__ import annotations

import contextlib
import os
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import msgspec

from .digest import DigestCache, WeightsStat, digest_file, digest_tree, weights_stat
from .errors import AdmissionRefused, RegistryError
from .gguf_check import GgufError, check_gguf
from .manifest import ModelEntry, ModelFormat, check_entry, to_toml
from .spec import Flavor, valid_token

__all__ = [
    "ModelEntry",
    "ModelFormat",
    "ModelRegistry",
    "ResolvedModel",
    "check_format",
]

_CACHE_FILE = ".digests.json"


class ResolvedModel(msgspec.Struct, frozen=True):
    """A verified model. ``path`` is absolute (a file or an MLX directory);
    None for an Ollama model, whose weights Ollama keeps."""

    entry: ModelEntry
    path: Path | None


_FLAVOR_FORMAT = {
    Flavor.LLAMACPP: ModelFormat.GGUF,
    Flavor.MLX_LM: ModelFormat.MLX,
    Flavor.OLLAMA: ModelFormat.OLLAMA,
}


def check_format(flavor: Flavor, resolved: ResolvedModel) -> None:
    """Refuse a model the flavor cannot run (llama.cpp: GGUF, mlx-lm: MLX, Ollama: tag).

    Raises:
        AdmissionRefused: naming the model, its format and the one needed.
    """
    need, have = _FLAVOR_FORMAT[flavor], resolved.entry.format
    if have is not need:
        raise AdmissionRefused(
            f"{flavor.value} cannot run model {resolved.entry.name}: it is {have.value}, "
            f"{flavor.value} needs {need.value}"
        )


@contextlib.contextmanager
def _io_errors(where: str) -> Iterator[None]:
    """Translate an ``OSError`` while reading or writing weights or manifests."""
    try:
        yield
    except OSError as e:
        raise RegistryError(f"{where}: {e}") from e


class ModelRegistry:
    """Manifests under ``root``; resolving one verifies the weights it names.

    Safe to share between threads.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._cache = DigestCache(self.root / _CACHE_FILE)
        self._writing = threading.Lock()

    def names(self) -> list[str]:
        """Names of every model with a manifest, sorted.

        Raises:
            RegistryError: the root is not a directory.
        """
        if not self.root.is_dir():
            raise RegistryError(f"model registry {self.root} is not a directory")
        return sorted(p.stem for p in self.root.glob("*.toml") if p.is_file())

    def _manifest(self, name: str) -> Path:
        if not valid_token(name):
            raise RegistryError(f"model name {name!r} must be a plain token (letters, digits, .-_)")
        return self.root / f"{name}.toml"

    def entry(self, name: str) -> ModelEntry:
        """Read and check ``name``'s manifest, without touching its weights.

        Raises:
            RegistryError: unknown model (known names listed), bad TOML, an
                unknown or mistyped key, or a rule broken.
        """
        manifest = self._manifest(name)
        if not manifest.is_file():
            # "model NAME: ..." as every other refusal of a manifest, so that a caller
            # naming the model first strips it rather than say it twice (stop 35's trial)
            known = ", ".join(self.names()) or "none: adopt one first"
            raise RegistryError(f"model {name}: not in the registry; registered models: {known}")
        try:
            raw = tomllib.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
            raise RegistryError(f"cannot read manifest {manifest}: {e}") from e
        allowed = ModelEntry.__struct_fields__
        if unknown := sorted(set(raw) - set(allowed)):
            raise RegistryError(
                f"{manifest}: unknown key {unknown[0]!r}; allowed keys: {', '.join(allowed)}"
            )
        try:
            entry = msgspec.convert(raw, ModelEntry)
        except msgspec.ValidationError as e:
            hint = f" (allowed: {', '.join(ModelFormat)})" if "$.format" in str(e) else ""
            raise RegistryError(f"{manifest}: {e}{hint}") from e
        if entry.name != name:
            raise RegistryError(
                f"{manifest}: name {entry.name!r} must match the file name {name!r}"
            )
        check_entry(entry, str(manifest))
        return entry

    def _contained(self, rel: str, where: str) -> Path:
        """The absolute weights path for ``rel``, refused if it could leave the root."""
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts:
            raise RegistryError(
                f"{where}: path {rel!r} must be relative to the registry root, without '..'"
            )
        root = self.root.resolve()
        target = (root / pure).resolve()
        if not target.is_relative_to(root) or target == root:
            raise RegistryError(f"{where}: path {rel!r} resolves to {target}, outside {root}")
        return target

    def _measure(self, target: Path, fmt: ModelFormat, where: str) -> WeightsStat:
        """The size and identity of existing weights of the right kind."""
        is_dir = fmt is ModelFormat.MLX
        if not (target.is_dir() if is_dir else target.is_file()):
            kind = "directory" if is_dir else "file"
            raise RegistryError(f"{where}: the {fmt.value} model {kind} {target} does not exist")
        return weights_stat(target, self.root.resolve())

    def _digest(self, target: Path, fmt: ModelFormat, stat: WeightsStat) -> str:
        root = self.root.resolve()
        if fmt is ModelFormat.MLX:
            return self._cache.digest(target, stat, lambda: digest_tree(target, root))
        return self._cache.digest(target, stat, lambda: digest_file(target))

    def locate(self, name: str) -> ResolvedModel:
        """``name``'s manifest and where its weights are, without reading them.

        For rebuilding an instance the chain knows: its weights are verified
        before each launch (:meth:`resolve`), not when it is rebuilt.

        Raises:
            RegistryError: unknown model, bad manifest, a path leaving the root,
                or weights that are not there.
        """
        entry = self.entry(name)
        if entry.format is ModelFormat.OLLAMA:
            return ResolvedModel(entry, None)
        where = f"model {name}"
        target = self._contained(entry.path, where)
        with _io_errors(where):
            self._measure(target, entry.format, where)
        return ResolvedModel(entry, target)

    def resolve(self, name: str) -> ResolvedModel:
        """The verified model ``name``: contained, present, right size, right
        digest, and (GGUF) a header and metadata that parse.

        Blocking: the first resolve of a model (or after its file changed in
        any way: see :mod:`.digest`) reads all of it; later ones hit the
        digest cache.

        Raises:
            RegistryError: what is wrong and with which manifest; a digest
                mismatch names the expected and the found digest.
        """
        located = self.locate(name)
        entry, target = located.entry, located.path
        if target is None:
            return located
        where = f"model {name}"
        with _io_errors(where):
            stat = self._measure(target, entry.format, where)
            if stat.size != entry.size_bytes:
                raise RegistryError(
                    f"{where}: size mismatch: manifest says {entry.size_bytes} bytes, "
                    f"{target} has {stat.size}"
                )
            found = self._digest(target, entry.format, stat)
            if found != entry.blake3:
                raise RegistryError(
                    f"{where}: digest mismatch for {target}: expected digest {entry.blake3}, "
                    f"found {found}"
                )
            if entry.format is ModelFormat.GGUF:
                _check_gguf(target, where)
        return located

    def adopt(
        self,
        name: str,
        file: Path | None = None,
        *,
        format: ModelFormat = ModelFormat.GGUF,
        ollama_tag: str | None = None,
        draft: str | None = None,
        replace: bool = False,
    ) -> ModelEntry:
        """Write ``name``'s manifest for weights already under the root.

        ``file`` (a GGUF file or MLX directory; relative paths are taken from
        the current directory) must lie inside the root: the manifest stores
        its path relative to the root, with its size and digest (blocking: the
        weights are read once). An Ollama model takes no file.

        Raises:
            RegistryError: a bad name, a file outside the root or of the wrong
                kind, an unknown draft, or a manifest that exists (without ``replace``).
        """
        manifest = self._manifest(name)
        if manifest.exists() and not replace:
            raise RegistryError(f"model {name} is already adopted ({manifest}); pass replace")
        if draft is not None and not self._manifest(draft).is_file():
            raise RegistryError(f"draft model {draft!r} is not in the registry; adopt it first")
        if format is ModelFormat.OLLAMA:
            if file is not None:
                raise RegistryError("an ollama model takes no file: Ollama keeps its weights")
            entry = ModelEntry(name=name, format=format, ollama_tag=ollama_tag, draft=draft)
        else:
            with _io_errors(f"adopting {name}"):
                entry = self._measured_entry(name, file, format, ollama_tag, draft)
        check_entry(entry, f"model {name}")
        with self._writing, _io_errors(f"writing {manifest}"):
            tmp = manifest.with_name(f".{manifest.name}.tmp")
            tmp.write_text(to_toml(entry), encoding="utf-8")
            os.replace(tmp, manifest)
        return entry

    def _measured_entry(
        self,
        name: str,
        file: Path | None,
        fmt: ModelFormat,
        ollama_tag: str | None,
        draft: str | None,
    ) -> ModelEntry:
        if file is None:
            raise RegistryError(f"adopting {name}: a {fmt.value} model needs its file")
        root = self.root.resolve()
        target = Path(file).resolve()
        if not target.is_relative_to(root) or target == root:
            raise RegistryError(
                f"adopting {name}: {file} is outside the registry root {root}; "
                "move or copy it under the root first"
            )
        stat = self._measure(target, fmt, f"adopting {name}")
        if fmt is ModelFormat.GGUF:
            _check_gguf(target, f"adopting {name}")
        return ModelEntry(
            name=name,
            format=fmt,
            path=target.relative_to(root).as_posix(),
            size_bytes=stat.size,
            blake3=self._digest(target, fmt, stat),
            ollama_tag=ollama_tag,
            draft=draft,
        )


def _check_gguf(target: Path, where: str) -> None:
    """Refuse a GGUF file whose header or metadata does not parse (OSError passes)."""
    try:
        check_gguf(target)
    except GgufError as e:
        raise RegistryError(f"{where}: {e}") from e
