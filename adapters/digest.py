"""BLAKE3 digests of model weights, and the cache that spares re-hashing them.

Source: new in infervisor (the reference verifies a manifest's digest in its
model registry, whose source is not in ``reference/``); the MLX directory
digest below is defined here.

A GGUF model's digest is the BLAKE3 of the file. An MLX model is a directory;
its digest (version 1) is the BLAKE3 of::

    b"infervisor.mlx-dir.v1" + b"\\0"
    then, for every regular file in the tree, sorted by its path relative to
    the directory (POSIX separators, compared as UTF-8 bytes):
        relative path (UTF-8) + b"\\0"
        + file size (8 bytes, big-endian)
        + the file's own BLAKE3 digest (32 bytes)

Paths cannot contain NUL and the other parts are fixed-size, so the encoding
is unambiguous; anyone can recompute it with a BLAKE3 library. A symlinked
directory inside the tree is refused; a symlinked file is followed but must
stay inside the registry root.

The cache (``<root>/.digests.json``) maps an absolute path to the digest last
computed for it, keyed by (size, mtime_ns): for a directory the total size and
the newest mtime in the tree. A change that keeps both the same is not seen;
that is the price of not reading tens of GiB at every start.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import blake3
import msgspec

from .errors import RegistryError

__all__ = ["DigestCache", "digest_file", "digest_tree", "tree_files", "weights_stat"]

_TREE_TAG = b"infervisor.mlx-dir.v1\0"


def digest_file(path: Path) -> str:
    """Hex BLAKE3 of one file (memory-mapped, multi-threaded)."""
    if path.stat().st_size == 0:
        return blake3.blake3().hexdigest()
    return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).hexdigest()


def tree_files(directory: Path, root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, resolved file) for every file under ``directory``, sorted.

    Raises:
        RegistryError: a symlinked directory inside, or a file resolving outside ``root``.
    """
    found: list[tuple[str, Path]] = []
    for here, dirs, files in os.walk(directory):
        for d in dirs:
            if os.path.islink(os.path.join(here, d)):
                raise RegistryError(f"{os.path.join(here, d)}: symlinked directories are refused")
        for name in files:
            path = Path(here, name)
            real = path.resolve()
            if not real.is_relative_to(root):
                raise RegistryError(f"{path} resolves to {real}, outside the registry root {root}")
            if real.is_file():
                found.append((path.relative_to(directory).as_posix(), real))
    return sorted(found, key=lambda item: item[0].encode("utf-8", "surrogateescape"))


def digest_tree(directory: Path, root: Path) -> str:
    """Hex digest of an MLX model directory, as defined in the module docstring."""
    h = blake3.blake3(_TREE_TAG)
    for rel, path in tree_files(directory, root):
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(path.stat().st_size.to_bytes(8, "big"))
        h.update(bytes.fromhex(digest_file(path)))
    return h.hexdigest()


def weights_stat(target: Path, root: Path) -> tuple[int, int]:
    """(size in bytes, mtime_ns) of a weights file, or of a directory's files
    (total size, newest mtime)."""
    if not target.is_dir():
        st = target.stat()
        return st.st_size, st.st_mtime_ns
    stats = [path.stat() for _, path in tree_files(target, root)]
    return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


class _Cached(msgspec.Struct, frozen=True):
    size: int
    mtime_ns: int
    blake3: str


_CACHE_TYPE = dict[str, _Cached]


class DigestCache:
    """Digests by (path, size, mtime_ns) in one small JSON file.

    A missing or unreadable cache is an empty one, and a cache that cannot be
    written is skipped: it only saves time. Safe to share between threads.
    """

    def __init__(self, file: Path) -> None:
        self.file = file
        self._lock = threading.Lock()

    def _load(self) -> dict[str, _Cached]:
        try:
            return msgspec.json.decode(self.file.read_bytes(), type=_CACHE_TYPE)
        except (OSError, msgspec.DecodeError):
            return {}

    def _save(self, entries: dict[str, _Cached]) -> None:
        live = {k: v for k, v in entries.items() if os.path.exists(k)}
        tmp = self.file.with_name(f"{self.file.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_bytes(msgspec.json.encode(live))
            os.replace(tmp, self.file)

    def digest(self, target: Path, stat: tuple[int, int], compute: Callable[[], str]) -> str:
        """The cached digest of ``target`` if its (size, mtime_ns) is ``stat``,
        else ``compute()`` (blocking: reads the whole model), which is then cached."""
        key = str(target)
        with self._lock:
            hit = self._load().get(key)
        if hit is not None and (hit.size, hit.mtime_ns) == stat:
            return hit.blake3
        found = compute()
        with self._lock:
            entries = self._load()
            entries[key] = _Cached(stat[0], stat[1], found)
            self._save(entries)
        return found
