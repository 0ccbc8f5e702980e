"""A controller's whole desired set, pure: ``decide_set(...) -> SetDecision``.

``PUT /v1/placements`` names every instance a controller wants on this node
at a generation. This rule compares it with what the chain has and answers
what to do, or why nothing is done:

- an instance the set names and the node does not have is **placed** (a new
  placement: refused while the node is cordoned or drained);
- one it has at an older generation, with the same spec, is **replaced**
  (``instance.replaced``: its generation raised, nothing restarted);
- one it has at this generation or newer, with the same spec, is
  **unchanged**;
- one this controller placed and the set does not name is **unloaded**;
- an item with ``start`` whose instance is neither wanted running nor up is
  **started** (refused on a drained node).

A set with a generation older than the controller's last recorded set is
refused (``stale_generation``); a set naming an instance twice, or one the
node has with another spec (a placement never replaces a spec: unload it
first), is refused naming the item. A newer generation is recorded
(``node.placement_set``) in the transaction of the set's new placements; a
repeated set records nothing, and once the node has converged, does
nothing. Source: issue 19, docs/api.md ("A whole desired set").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

from infervisor.replay import events as ev
from infervisor.replay.cordon_reason import CordonInForce
from infervisor.replay.state import Cordon

from .cordon import placement_refusal

__all__ = ["Asked", "Existing", "Item", "SetDecision", "SetRefusal", "SetRefusalKind", "decide_set"]


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One item of the set: its instance id, its spec (as the chain stores it), ``start``."""

    instance_id: str
    spec: dict[str, Any]
    start: bool = True


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """The set: who asks, at which generation, and its items in order."""

    controller: str
    generation: int
    items: tuple[Item, ...]


class Existing(msgspec.Struct, frozen=True, kw_only=True):
    """What the chain has of one instance: who placed it, at which generation,
    its spec, and whether it is wanted running or has something up."""

    placed_by: str
    generation: int
    spec: dict[str, Any]
    running: bool = False


class SetRefusalKind(enum.StrEnum):
    """Why a set is refused (the API's code)."""

    STALE = "stale_generation"
    CORDONED = "cordoned"
    INVALID = "invalid_state"
    BAD_VALUE = "bad_value"


class SetRefusal(msgspec.Struct, frozen=True):
    """The refusal: its kind, the message, and the field at fault (``placements[2].spec``)."""

    kind: SetRefusalKind
    message: str
    field: str


class SetDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What the set calls for: the events to record with the new placements (one
    transaction), then the placements, replacements, unloads and starts.

    Attributes:
        events: ``node.placement_set`` for a newer generation, else nothing.
        place: the indexes of the items to place (new instances).
        replace: instance ids to raise to the set's generation.
        unload: instance ids this controller placed that the set does not name.
        unchanged: instance ids as the set wants them already.
        start: instance ids to start once placed.
        refusal: why nothing is done (None: do it).
    """

    events: tuple[ev.Event, ...] = ()
    place: tuple[int, ...] = ()
    replace: tuple[str, ...] = ()
    unload: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    start: tuple[str, ...] = ()
    refusal: SetRefusal | None = None

    @property
    def idle(self) -> bool:
        """Nothing to record and nothing to do."""
        return not (self.events or self.place or self.replace or self.unload or self.start)


def _refused(kind: SetRefusalKind, message: str, field: str) -> SetDecision:
    return SetDecision(refusal=SetRefusal(kind, message, field))


def _item_refusal(
    n: int, item: Item, have: Existing | None, cordon: Cordon, in_force: CordonInForce | None
) -> SetDecision | None:
    """Why item ``n`` refuses the set (None: it does not)."""
    at = f"placements[{n}]"
    if have is None:
        why = placement_refusal(cordon, in_force)
        return None if why is None else _refused(SetRefusalKind.CORDONED, why, at)
    if have.spec != item.spec:
        changed = sorted(
            k for k in have.spec.keys() | item.spec.keys() if have.spec.get(k) != item.spec.get(k)
        )
        return _refused(
            SetRefusalKind.INVALID,
            f"{item.instance_id} is placed with another spec ({', '.join(changed)} differ): "
            "a placement never replaces a spec; leave it out of a set first (it is "
            "unloaded), then place the new spec",
            f"{at}.spec",
        )
    if cordon is Cordon.DRAINED and item.start and not have.running:
        why = f"the node is drained: {item.instance_id} stays stopped until it is uncordoned"
        return _refused(SetRefusalKind.CORDONED, why + "; send start false", f"{at}.start")
    return None


def decide_set(
    asked: Asked,
    placed: Mapping[str, Existing],
    last: int | None,
    cordon: Cordon,
    in_force: CordonInForce | None = None,
) -> SetDecision:
    """What ``asked`` calls for on a node that has ``placed`` (by id), whose last set
    from this controller had generation ``last`` (None: none), cordoned or not
    (``in_force``: the cordon event in force, which a refusal names: since when
    and why) (pure)."""
    if last is not None and asked.generation < last:
        return _refused(
            SetRefusalKind.STALE,
            f"generation {asked.generation} is older than {asked.controller}'s last set "
            f"here (generation {last}): nothing done",
            "generation",
        )
    seen: dict[str, int] = {}
    for n, item in enumerate(asked.items):
        if item.instance_id in seen:
            why = f"names {item.instance_id} again (placements[{seen[item.instance_id]}])"
            return _refused(SetRefusalKind.BAD_VALUE, f"placements[{n}] {why}", f"placements[{n}]")
        seen[item.instance_id] = n
        refusal = _item_refusal(n, item, placed.get(item.instance_id), cordon, in_force)
        if refusal is not None:
            return refusal
    return _plan(asked, placed, last)


def _plan(asked: Asked, placed: Mapping[str, Existing], last: int | None) -> SetDecision:
    place: list[int] = []
    replace: list[str] = []
    unchanged: list[str] = []
    start: list[str] = []
    for n, item in enumerate(asked.items):
        have = placed.get(item.instance_id)
        if have is None:
            place.append(n)
        elif have.generation < asked.generation:
            replace.append(item.instance_id)
        else:
            unchanged.append(item.instance_id)
        if item.start and (have is None or not have.running):
            start.append(item.instance_id)
    named = {item.instance_id for item in asked.items}
    unload = sorted(
        iid
        for iid, have in placed.items()
        if have.placed_by == asked.controller and iid not in named
    )
    events: tuple[ev.Event, ...] = ()
    if last is None or asked.generation > last:
        ids = [item.instance_id for item in asked.items]
        events = (
            ev.PlacementSet(
                controller=asked.controller, generation=asked.generation, instances=ids
            ),
        )
    return SetDecision(
        events=events,
        place=tuple(place),
        replace=tuple(replace),
        unload=tuple(unload),
        unchanged=tuple(unchanged),
        start=tuple(start),
    )
