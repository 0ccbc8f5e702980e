"""The control API's bodies for a fleet: cordon and drain, and a controller's
whole desired set (``PUT /v1/placements``). msgspec types, as in
:mod:`.wire`; the shapes are docs/api.md's ("Cordon and drain", "A whole
desired set")."""

from __future__ import annotations

from typing import Annotated

import msgspec

from infervisor.adapters.spec import InstanceSpec

from .one_line import ALLOWED, MAX_REASON, PATTERN
from .wire import ControllerId, ErrorBody, Generation

__all__ = [
    "MAX_PLACEMENTS",
    "CordonAnswer",
    "CordonRequest",
    "PlaceItem",
    "PlacementSet",
    "PlacementSetAnswer",
]

#: The most items one placement set may have.
MAX_PLACEMENTS = 1024

#: Why, for the chain: one line (tools/api/one_line.py, the rule ``--reason`` follows too).
Reason = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_REASON, pattern=PATTERN, description=f"Why, for the chain: {ALLOWED}."
    ),
]


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CordonRequest(_Body, frozen=True):
    """The optional body of cordon, drain and uncordon: why (recorded in the event)."""

    reason: Reason | None = None


class CordonAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The node's cordon after the verb (``none``, ``cordoned``, ``drained``), the
    instances a drain stopped, and the chain's head once its event is durable;
    ``recorded`` false: nothing was recorded (the node was so already and no new
    reason was given, or the reason given is the one in force, or a cordon of a
    drained node: the drain's reason stands); ``reason`` and ``since_ns`` are the
    cordon or drain in force after the verb, from the chain: its event's reason
    (null: none given) and time (ns since the epoch, UTC; null: uncordoned)."""

    cordon: str
    stopped: list[str]
    seq: int
    hash: str
    recorded: bool = True
    reason: str | None = None
    since_ns: int | None = None


class PlaceItem(_Body, frozen=True):
    """One instance of a set: its whole spec (its id is the spec's, as for
    ``POST /v1/instances``) and whether it should run."""

    spec: InstanceSpec
    start: bool = True


class PlacementSet(_Body, frozen=True):
    """Everything ``controller`` wants on this node, at ``generation``: what it
    placed here and the set does not name is unloaded."""

    controller: ControllerId
    generation: Generation
    placements: Annotated[list[PlaceItem], msgspec.Meta(max_length=MAX_PLACEMENTS)]


class PlacementSetAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What the set did, by instance id: ``placed`` (new), ``replaced`` (raised to
    this generation), ``unloaded`` (placed by this controller, no longer named),
    ``unchanged``, ``started``; ``start_errors`` the starts refused (the
    placement stands). ``seq``/``hash``: the chain's head once done. A repeated
    set answers everything ``unchanged`` and records nothing."""

    controller: str
    generation: int
    placed: list[str]
    replaced: list[str]
    unloaded: list[str]
    unchanged: list[str]
    started: list[str]
    seq: int
    hash: str
    start_errors: dict[str, ErrorBody] = msgspec.field(default_factory=dict)
