"""Errors raised by the adapters: what talks to model servers and processes.

The tree (callers never see ``httpx``, ``OSError`` or ``psutil`` errors from
an adapter; they are translated here, at the edge)::

    AdapterError
     +-- SpecError          a spec field is invalid (names the field and what is allowed)
     +-- RegistryError      a model is missing, malformed, or fails its digest
     +-- AdmissionRefused   the instance cannot be placed or started here (flavor
     |    |                 mismatch, budget, ...); nothing was changed
     |    +-- AddressTaken  something else already listens on the instance's address
     |    +-- ProgramMissing  the serve program is not installed or not executable
     +-- SpawnError         the server process could not be launched
     +-- ProcessControlError  a process group could not be signalled, or outlived SIGKILL
     +-- ProbeError         a server could not be asked (only where a caller needs the reason)
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "AddressTaken",
    "AdmissionRefused",
    "ProbeError",
    "ProcessControlError",
    "ProgramMissing",
    "RegistryError",
    "SpawnError",
    "SpecError",
    "excerpt",
]

_EXCERPT = 200  # characters of a body quoted in a message


class AdapterError(Exception):
    """Base of every error an adapter raises."""


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


class SpawnError(AdapterError):
    """The server process could not be launched (missing program, bad cwd, ...)."""


class ProbeError(AdapterError):
    """A server could not be probed."""


class ProcessControlError(AdapterError):
    """A process group could not be signalled (not permitted, or a protected group),
    or members of it were still alive after SIGKILL and the confirmation deadline."""


class ProgramMissing(AdmissionRefused):
    """The serve program is not installed or not executable: the node's own
    condition (recorded for the audit), not a mistake of the caller."""


def excerpt(body: bytes) -> str:
    """A server's answer as quoted in an error or a probe's reason: white space
    folded, at most 200 characters (then ``...``), undecodable bytes replaced."""
    text = " ".join(body[: _EXCERPT * 4].decode("utf-8", errors="replace").split())
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."
