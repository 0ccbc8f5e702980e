"""Errors the node raises to its controller.

The tree (adapter errors, such as ``AdmissionRefused``, ``SpecError`` and
``RegistryError``, pass through unchanged: they already say what to fix)::

    NodeError
     +-- VerbRefused       the verb was refused; state and chain are as they were
     |    +-- UnknownInstance
     |    +-- InvalidState  (names the current state and what the verb needs)
     |    +-- BadArgument   a verb's argument is out of range (names it and the range)
     |         +-- NotAController  a controller named as the node's own id
     |    +-- Cordoned      the node is cordoned or drained (a new placement, a start)
     |    +-- StaleGeneration  a placement set older than the controller's last
     |    +-- SetItemRefused   one item of a placement set is refused (its index)
     |    +-- NotResident   a request or verb for an instance cannot be served by a
     |                      resident server now (``code``, ``retry_after_s``)
     +-- VerbTimeout       the verb was accepted but did not complete in time
     +-- VerbFailed        the verb was accepted but its work failed (an unload Ollama refused)
     +-- RecordFailed      the chain could not record the decision: nothing was done
     +-- WitnessConflict   at boot, a witness refuses the chain (rollback or fork)
"""

from __future__ import annotations

__all__ = [
    "BadArgument",
    "Cordoned",
    "InvalidState",
    "NodeError",
    "NotAController",
    "NotResident",
    "RecordFailed",
    "SetItemRefused",
    "StaleGeneration",
    "UnknownInstance",
    "VerbFailed",
    "VerbRefused",
    "VerbTimeout",
    "WitnessConflict",
]


class NodeError(Exception):
    """Base of the node's own errors."""


class VerbRefused(NodeError):
    """A verb was refused before anything changed."""


class UnknownInstance(VerbRefused):
    """No instance with that id is placed on this node."""

    def __init__(self, instance_id: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"no instance {instance_id!r} on this node (placed: {listed})")
        self.instance_id = instance_id


class InvalidState(VerbRefused):
    """The instance's lifecycle state does not allow the verb."""


class BadArgument(VerbRefused, ValueError):
    """A verb's argument is out of range; the message names it and the allowed range."""


class NotAController(BadArgument):
    """A request names the node's own id as its ``controller``: the node is not a
    controller of itself (its own placements are under no lease). Issue 19."""


class Cordoned(VerbRefused):
    """The node is cordoned or drained: no new placement, and no start of a
    controller's instance while drained (actors/core/cordon.py)."""


class StaleGeneration(VerbRefused):
    """A controller's placement set is older than the last one it set here."""


class SetItemRefused(VerbRefused):
    """Item ``index`` of a placement set is refused: ``error`` says why (nothing of
    the set was done)."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"placements[{index}]: {error}")
        self.index = index
        self.error = error


class NotResident(VerbRefused):
    """A request (or verb) for an instance cannot be served by a resident server
    now; the front answers it 503 with ``Retry-After`` (issue 21).

    Attributes:
        code: why, one of :data:`NOT_RESIDENT_CODES`: ``no_room`` (nothing can be
            evicted to make it fit: the message has the numbers), ``queue_full``
            (too many requests already wait for it to load), ``stopped`` (an
            operator or controller stopped it: the message names who),
            ``failed`` (held failed for the operator), ``start_timeout`` (it did
            not become ready within its kind's start-up deadline).
        retry_after_s: seconds after which a retry may succeed (>= 0).
    """

    def __init__(self, message: str, *, code: str, retry_after_s: float = 1.0) -> None:
        if code not in NOT_RESIDENT_CODES:
            raise ValueError(f"code {code!r}: one of {', '.join(NOT_RESIDENT_CODES)}")
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


#: The reasons a :class:`NotResident` may give.
NOT_RESIDENT_CODES = ("no_room", "queue_full", "stopped", "failed", "start_timeout")


class VerbTimeout(NodeError):
    """A verb was accepted (and recorded) but its effect was not seen in time."""


class VerbFailed(NodeError):
    """A verb was accepted and recorded, but the work it asked for failed."""


class RecordFailed(NodeError):
    """The chain could not record a decision (database busy, disk full): no
    effect of it ran, and state is what the chain says."""


class WitnessConflict(NodeError):
    """At boot, a witness cosigned more of this chain than it has, or something
    the chain does not extend (a rollback or a fork): the node does not resume.
    The message is one line naming the witness and both sizes."""
