"""The node's events of a fleet: cordon, drain, uncordon and a controller's
placement set. Members of :data:`.events.Event` (the chain's one union) and
re-exported there; their own module keeps events.py short.

Their base is the chain's event shape (:class:`.event_base.EventBase`): tagged by
``event``, payload version ``v``.
"""

from __future__ import annotations

from .event_base import EventBase

__all__ = ["NodeCordoned", "NodeDrained", "NodeUncordoned", "PlacementSet"]


class NodeCordoned(EventBase, frozen=True, tag="node.cordoned"):
    """The node takes no new placements (``POST /v1/node/cordon``) until uncordoned.
    What runs keeps running. ``reason``: the caller's, if given."""

    reason: str | None = None


class NodeDrained(EventBase, frozen=True, tag="node.drained"):
    """Cordoned, and every instance a controller placed is stopped with its grace
    (``POST /v1/node/drain``); they stay stopped, also across a node restart,
    until the node is uncordoned. Recorded before the first stop."""

    reason: str | None = None


class NodeUncordoned(EventBase, frozen=True, tag="node.uncordoned"):
    """Cordon and drain end (``POST /v1/node/uncordon``): placements are taken again
    and a drained instance may be started again (nothing is started by it)."""

    reason: str | None = None


class PlacementSet(EventBase, frozen=True, tag="node.placement_set"):
    """A controller's whole desired set at ``generation`` (``PUT /v1/placements``):
    ``instances`` are the ids it names. Recorded once per generation, in the
    transaction of the set's new placements; a set with a lower generation from
    that controller is refused."""

    controller: str
    generation: int
    instances: list[str]
