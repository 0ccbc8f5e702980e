"""The node-wide facts of cordon, drain and controllers' placement sets, folded
from their events (``node.cordoned``, ``node.drained``, ``node.uncordoned``,
``node.placement_set``): pure, as the rest of the reducer."""

from __future__ import annotations

from typing import Any

from . import events as ev
from .state import Cordon

__all__ = ["NODE_SET_TYPES", "node_sets"]

#: The cordon each cordon event leaves the node in.
_CORDON_OF: dict[type[Any], Cordon] = {
    ev.NodeCordoned: Cordon.CORDONED,
    ev.NodeDrained: Cordon.DRAINED,
    ev.NodeUncordoned: Cordon.NONE,
}
#: The event types folded here.
NODE_SET_TYPES: frozenset[type[Any]] = frozenset({*_CORDON_OF, ev.PlacementSet})


def node_sets(
    cordon: Cordon, sets: dict[str, int], event: ev.Event
) -> tuple[Cordon, dict[str, int]]:
    """The cordon and each controller's last set generation after ``event``
    (``sets`` is not changed: a new dict is answered when it changes)."""
    if isinstance(event, ev.PlacementSet):
        return cordon, {**sets, event.controller: event.generation}
    return _CORDON_OF.get(type(event), cordon), sets
