"""How the node's exceptions become the control API's answers (server side).

:func:`answer_for` maps an exception to ``(status, ErrorBody)`` by the table
:data:`BY_CLASS` (first match wins, so subclasses come first); an
:class:`~.errors.ApiError` answers with its own code. What a client raises
for each answer is :mod:`.errors`, which imports nothing of the node.
"""

from __future__ import annotations

import pykka

from infervisor.actors.errors import (
    BadArgument,
    Cordoned,
    InvalidState,
    NotAController,
    NotResident,
    RecordFailed,
    StaleGeneration,
    UnknownInstance,
    VerbRefused,
    VerbTimeout,
)
from infervisor.actors.errors import (
    VerbFailed as NodeVerbFailed,
)
from infervisor.actors.ledger import BudgetExceeded
from infervisor.adapters.errors import (
    AddressTaken,
    AdmissionRefused,
    ProbeError,
    RegistryError,
    SpecError,
)
from infervisor.adapters.proc.errors import ProcessControlError, SpawnError
from infervisor.adapters.spec import InstanceSpec

from .errors import ApiError
from .exit_codes import cut
from .wire import ErrorBody

__all__ = ["BY_CLASS", "answer_for", "spec_field"]


#: Exception class -> (HTTP status, code). First match wins: subclasses first.
BY_CLASS: tuple[tuple[type[BaseException], int, str], ...] = (
    (AddressTaken, 409, "port_taken"),
    # a start that does not fit: one code for the verbs and the front (docs/api.md)
    (BudgetExceeded, 422, "no_room"),
    (AdmissionRefused, 422, "admission_refused"),
    (UnknownInstance, 404, "unknown_instance"),
    (NotAController, 400, "invalid"),
    (Cordoned, 409, "cordoned"),
    (StaleGeneration, 409, "stale_generation"),
    (BadArgument, 400, "bad_value"),
    (InvalidState, 409, "invalid_state"),
    (VerbRefused, 409, "refused"),
    (SpecError, 400, "bad_spec"),
    (RegistryError, 400, "bad_spec"),
    (VerbTimeout, 504, "timeout"),
    (pykka.Timeout, 504, "timeout"),
    (RecordFailed, 503, "record_failed"),
    (SpawnError, 500, "spawn_failed"),
    (ProbeError, 502, "probe_failed"),
    (ProcessControlError, 500, "node_error"),
    (NodeVerbFailed, 500, "verb_failed"),
)


def answer_for(error: BaseException) -> tuple[int, ErrorBody]:
    """The status and body an exception of the node's is answered with."""
    if isinstance(error, ApiError):
        return error.status, ErrorBody(code=error.code, message=cut(str(error)), field=error.field)
    if isinstance(error, NotResident):  # its own code: no_room for a verb's start
        # queue_full: too many verb starts wait for room already; retry, as for a full listener
        status = 503 if error.code == "queue_full" else 422
        return status, ErrorBody(code=error.code, message=cut(str(error)))
    for cls, status, code in BY_CLASS:
        if isinstance(error, cls):
            field = _bad_spec_field(error) if code == "bad_spec" else None
            if isinstance(error, AddressTaken):
                field = "spec.port"  # "something is already listening on HOST:PORT; ..."
            if isinstance(error, UnknownInstance):
                field = "instance_id"
            if isinstance(error, BadArgument):
                field = str(error).split(" ", 1)[0] or None
            return status, ErrorBody(code=code, message=cut(str(error)), field=field)
    return 500, ErrorBody(code="node_error", message=cut(f"{type(error).__name__}: {error}"))


_SPEC_FIELDS = frozenset(InstanceSpec.__struct_fields__)


def _bad_spec_field(error: BaseException) -> str:
    """The field a ``bad_spec`` answer names: the SpecError's own ``field``
    (``env.PATH`` -> ``spec.env.PATH``), else the spec field its message
    starts with, else ``spec`` (the spec as a whole): never null."""
    own = getattr(error, "field", None) if isinstance(error, SpecError) else None
    if own:
        return f"spec.{own}"
    return spec_field(str(error)) or "spec"


def spec_field(message: str) -> str | None:
    """``spec.<field>`` when a spec error's message starts with a spec field's name
    (``spec.restart.base_s`` for ``restart.base_s ...``).

    The node's spec errors name the field first (``port 0 is out of range``,
    ``model: managed mode needs ...``), adapters/spec.py.
    """
    first = message.split(" ", 1)[0].rstrip(":")
    return f"spec.{first}" if first.split(".", 1)[0] in _SPEC_FIELDS else None
