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
computed for it, keyed by the file's identity: device, inode, size, mtime_ns
and ctime_ns (for a directory, every file's, with its relative path). A
rewrite in place changes ctime_ns, which no unprivileged call can set back
(``os.utime`` restores mtime only), and a file replaced by another changes
the inode: a hit therefore means the bytes were not written since they were
hashed. Anything else is hashed again.
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

__all__ = ["DigestCache", "WeightsStat", "digest_file", "digest_tree", "tree_files", "weights_stat"]

_TREE_TAG = b"infervisor.mlx-dir.v1\0"
#: One lock for every cache in this process: instances verify on their own threads.
_LOCK = threading.Lock()


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


class WeightsStat(msgspec.Struct, frozen=True):
    """What proves weights unchanged since they were hashed.

    Attributes:
        size: bytes (a directory: the total of its files).
        identity: ``dev:ino:size:mtime_ns:ctime_ns`` of the file; for a
            directory the BLAKE3 of every file's relative path and identity.
    """

    size: int
    identity: str


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def weights_stat(target: Path, root: Path) -> WeightsStat:
    """The :class:`WeightsStat` of a weights file or MLX directory (no content read).

    Raises:
        OSError: the weights cannot be stat'ed.
        RegistryError: see :func:`tree_files`.
    """
    if not target.is_dir():
        st = target.stat()
        return WeightsStat(st.st_size, _identity(st))
    h = blake3.blake3(_TREE_TAG)
    total = 0
    for rel, path in tree_files(target, root):
        st = path.stat()
        total += st.st_size
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + _identity(st).encode() + b"\0")
    return WeightsStat(total, h.hexdigest())


class _Cached(msgspec.Struct, frozen=True):
    identity: str
    blake3: str


_CACHE_TYPE = dict[str, _Cached]


class DigestCache:
    """Digests by path and :class:`WeightsStat` identity in one small JSON file.

    A missing or unreadable cache is an empty one (an entry of an older shape
    is a miss), and a cache that cannot be written is skipped: it only saves
    time. Safe to share between threads.
    """

    def __init__(self, file: Path) -> None:
        self.file = file
        self._lock = _LOCK

    def _load(self) -> dict[str, _Cached]:
        try:
            return msgspec.json.decode(self.file.read_bytes(), type=_CACHE_TYPE)
        except (OSError, msgspec.DecodeError):  # ValidationError too: an older shape
            return {}

    def _save(self, entries: dict[str, _Cached]) -> None:
        live = {k: v for k, v in entries.items() if os.path.exists(k)}
        tmp = self.file.with_name(f"{self.file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_bytes(msgspec.json.encode(live))
            os.replace(tmp, self.file)

    def digest(self, target: Path, stat: WeightsStat, compute: Callable[[], str]) -> str:
        """The cached digest of ``target`` if its identity is still ``stat``'s,
        else ``compute()`` (blocking: reads the whole model), which is then cached.

        ``stat`` must be taken before ``compute`` reads the weights, so that a
        write during the hashing leaves an identity that no longer matches.
        """
        key = str(target)
        with self._lock:
            hit = self._load().get(key)
        if hit is not None and hit.identity == stat.identity:
            return hit.blake3
        found = compute()
        with self._lock:
            entries = self._load()
            entries[key] = _Cached(stat.identity, found)
            self._save(entries)
        return found
