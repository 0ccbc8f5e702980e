"""Errors raised by the adapters: what talks to model servers and processes.

The root, :class:`AdapterError`, and the two errors of process supervision
(``SpawnError``, ``ProcessControlError``) are in ``adapters/proc/errors.py``,
which imports nothing from here. The tree (callers never see ``httpx``,
``OSError`` or ``psutil`` errors from an adapter; they are translated at the
edge)::

    AdapterError
     +-- SpecError          a spec field is invalid (names the field and what is allowed)
     +-- RegistryError      a model is missing, malformed, or fails its digest
     +-- AdmissionRefused   the instance cannot be placed or started here (flavor
     |    |                 mismatch, budget, ...); nothing was changed
     |    +-- AddressTaken  something else already listens on the instance's address
     |    +-- ProgramMissing  the serve program is not installed or not executable
     +-- SpawnError         (adapters/proc/errors.py) the server process could not be launched
     +-- ProcessControlError  (adapters/proc/errors.py) a process group could not be
     |                      signalled, or outlived SIGKILL
     +-- ProbeError         a server could not be asked (only where a caller needs the reason)
"""

from __future__ import annotations

from .proc.errors import AdapterError

__all__ = [
    "AddressTaken",
    "AdmissionRefused",
    "ProbeError",
    "ProgramMissing",
    "RegistryError",
    "SpecError",
    "excerpt",
]

_EXCERPT = 200  # characters of a body quoted in a message


class SpecError(AdapterError, ValueError):
    """An instance spec is invalid; the message names the field and the allowed values.

    ``field`` is the path of the field at fault inside the spec (``port``,
    ``env.PATH``, ``restart``); the control API answers it as ``spec.<field>``.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RegistryError(AdapterError):
    """A model could not be resolved from the model registry."""


class AdmissionRefused(AdapterError):
    """The instance is refused; the message says why and what would fix it."""


class AddressTaken(AdmissionRefused):
    """Something already listens on the instance's address; nothing is started over it."""


class ProbeError(AdapterError):
    """A server could not be probed."""


class ProgramMissing(AdmissionRefused):
    """The serve program is not installed or not executable: the node's own
    condition (recorded for the audit), not a mistake of the caller."""


def excerpt(body: bytes) -> str:
    """A server's answer as quoted in an error or a probe's reason: white space
    folded, at most 200 characters (then ``...``), undecodable bytes replaced."""
    text = " ".join(body[: _EXCERPT * 4].decode("utf-8", errors="replace").split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."
