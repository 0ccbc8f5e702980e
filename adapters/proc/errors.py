"""The root of the adapters' error tree, and the errors of process supervision.

The root lives here, in the leaf subpackage, because process supervision
imports nothing from the rest of ``adapters`` (the arrow points one way:
``adapters`` -> ``adapters.proc``); ``adapters/errors.py`` holds the rest of
the tree. Callers never see ``OSError`` or ``psutil`` errors from process
supervision: they are translated into these two::

    AdapterError
     +-- SpawnError           the server process could not be launched
     +-- ProcessControlError  a process group could not be signalled, or outlived SIGKILL
     +-- ...                  (adapters/errors.py)
"""

from __future__ import annotations

__all__ = ["AdapterError", "ProcessControlError", "SpawnError"]


class AdapterError(Exception):
    """Base of every error an adapter raises."""


class SpawnError(AdapterError):
    """The server process could not be launched (missing program, bad cwd, ...)."""


class ProcessControlError(AdapterError):
    """A process group could not be signalled (not permitted, or a protected group),
    or members of it were still alive after SIGKILL and the confirmation deadline."""
