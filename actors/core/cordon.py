"""Cordon and drain, node-wide: ``decide_cordon(cordon, observation, placed, in_force)``.

Pure, as the rest of the core: it reads the node's cordon (folded from the
chain, ``NodeState.cordon``), the cordon event in force (its reason and time,
read from the chain: replay/cordon_reason.py), one observation and what each instance is
(:class:`Held`: who placed it, whether it is wanted running or has something
up), and answers the cordon after, the event to append and which instances
to stop. The node executes it (actors/node_cordon.py): it appends the event,
and only once that is durable asks each instance named to stop with its
grace (the instance rule of a stop decides the rest). Boot is one more
observation: a node killed in the middle of a drain finds ``node.drained``
in its chain, holds the controllers' instances at boot (nothing of them is
started again) and stops those still wanted running, as the live node would
have.

=============  ===========================  ===========================  ===========================
now            cordon                       drain                        uncordon
=============  ===========================  ===========================  ===========================
``none``       ``node.cordoned``            ``node.drained``, stop       nothing
``cordoned``   ``node.cordoned`` if a new   ``node.drained``, stop       ``node.uncordoned``
               reason
``drained``    nothing (drain holds it)     ``node.drained`` if a new    ``node.uncordoned``
                                            reason, stop what is left
=============  ===========================  ===========================  ===========================

A cordon of a cordoned node, or a drain of a drained one, given a new reason
records its event again: the reason in force is the last cordon event's
(replay/cordon_reason.py), so the new one replaces it and the cordon itself is
unchanged (stop 32's trial: the new reason was dropped, silently). Without a
reason, or with the reason already in force (a controller re-sending its
cordon), nothing is recorded (stop 33: each re-send was recorded again). A
cordon of a drained node records nothing (the drain holds, with its reason).
The answer says so (``recorded`` false), with the reason in force and since
when (the time of its event).

"Stop" names every instance a controller placed (``placed_by`` is not this
node) that is wanted running or still has something up. What the operator
(or the node's config) placed is never stopped by a drain. Source: issue 19
and docs/api.md ("Cordon and drain").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from infervisor.replay import events as ev
from infervisor.replay.cordon_reason import CordonInForce, in_force_said
from infervisor.replay.state import Cordon

__all__ = [
    "CORDON_RULES",
    "BootFound",
    "CordonAsked",
    "CordonDecision",
    "CordonObservation",
    "DrainAsked",
    "Held",
    "UncordonAsked",
    "decide_cordon",
    "placement_refusal",
    "start_refusal",
]


class Held(msgspec.Struct, frozen=True, kw_only=True):
    """What a drain needs of one instance.

    Attributes:
        instance_id: the instance.
        by_controller: a controller placed it (``placed_by`` is not this node).
        wanted_running: its desired state is ``running``.
        up: something of it is starting, running, unhealthy or stopping.
    """

    instance_id: str
    by_controller: bool
    wanted_running: bool
    up: bool = False


# ---------------------------------------------------------------- observations
class CordonAsked(msgspec.Struct, frozen=True):
    """``POST /v1/node/cordon``: take no new placements."""

    reason: str | None = None


class DrainAsked(msgspec.Struct, frozen=True):
    """``POST /v1/node/drain``: cordon, and stop what controllers placed."""

    reason: str | None = None


class UncordonAsked(msgspec.Struct, frozen=True):
    """``POST /v1/node/uncordon``: end cordon and drain."""

    reason: str | None = None


class BootFound(msgspec.Struct, frozen=True):
    """The node (re)started with the cordon its chain has."""


CordonObservation = CordonAsked | DrainAsked | UncordonAsked | BootFound


class CordonDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one observation of the cordon calls for.

    Attributes:
        cordon: the cordon after it.
        events: to append (node-level, no subject) before anything is stopped.
        stop: the instances to stop, with their grace, once ``events`` are durable.
        hold: the instances boot must not start again (a drained node's
            controllers' instances).
    """

    cordon: Cordon
    events: tuple[ev.Event, ...] = ()
    stop: tuple[str, ...] = ()
    hold: tuple[str, ...] = ()


def _to_stop(placed: Iterable[Held]) -> tuple[str, ...]:
    """A controller's instances wanted running or with something up, by id."""
    return tuple(
        sorted(h.instance_id for h in placed if h.by_controller and (h.wanted_running or h.up))
    )


# ---------------------------------------------------------------- the rules
#: In force: the cordon event in force (None: uncordoned, or none read).
InForce = CordonInForce | None


def _new_reason(reason: str | None, in_force: InForce) -> bool:
    """Whether ``reason`` would replace the one in force (None keeps it)."""
    return reason is not None and (in_force is None or reason != in_force.reason)


def _cordon(cordon: Cordon, asked: CordonAsked, _: Iterable[Held], now: InForce) -> CordonDecision:
    """Cordon a node that is not: recorded; a cordoned one given a new reason:
    recorded again (its reason replaced); the same reason, or none: nothing; a
    drained one stays as it is."""
    if cordon is Cordon.DRAINED or (
        cordon is Cordon.CORDONED and not _new_reason(asked.reason, now)
    ):
        return CordonDecision(cordon=cordon)
    return CordonDecision(cordon=Cordon.CORDONED, events=(ev.NodeCordoned(reason=asked.reason),))


def _drain(
    cordon: Cordon, asked: DrainAsked, placed: Iterable[Held], now: InForce
) -> CordonDecision:
    """Record the drain (unless drained already with that reason, or given none),
    then stop the controllers' instances."""
    events: tuple[ev.Event, ...] = ()
    if cordon is not Cordon.DRAINED or _new_reason(asked.reason, now):
        events = (ev.NodeDrained(reason=asked.reason),)
    return CordonDecision(cordon=Cordon.DRAINED, events=events, stop=_to_stop(placed))


def _uncordon(
    cordon: Cordon, asked: UncordonAsked, _: Iterable[Held], now: InForce
) -> CordonDecision:
    """End a cordon or a drain: recorded; nothing is started by it."""
    if cordon is Cordon.NONE:
        return CordonDecision(cordon=cordon)
    return CordonDecision(cordon=Cordon.NONE, events=(ev.NodeUncordoned(reason=asked.reason),))


def _boot(cordon: Cordon, _: BootFound, placed: Iterable[Held], now: InForce) -> CordonDecision:
    """A drained node holds its controllers' instances at boot and stops those still
    wanted running (a drain the last node was killed in the middle of)."""
    if cordon is not Cordon.DRAINED:
        return CordonDecision(cordon=cordon)
    held = tuple(placed)
    hold = tuple(sorted(h.instance_id for h in held if h.by_controller))
    return CordonDecision(cordon=cordon, stop=_to_stop(held), hold=hold)


#: Every observation of the cordon and the rule that decides it.
CORDON_RULES: dict[type[Any], Callable[[Cordon, Any, Iterable[Held], InForce], CordonDecision]] = {
    CordonAsked: _cordon,
    DrainAsked: _drain,
    UncordonAsked: _uncordon,
    BootFound: _boot,
}


def decide_cordon(
    cordon: Cordon,
    observation: CordonObservation,
    placed: Iterable[Held],
    in_force: InForce = None,
) -> CordonDecision:
    """What ``observation`` calls for on a node whose cordon is ``cordon``, the
    cordon event in force being ``in_force`` (pure)."""
    return CORDON_RULES[type(observation)](cordon, observation, placed, in_force)


# ---------------------------------------------------------------- refusals
def _said(in_force: InForce) -> str:
    return "" if in_force is None else in_force_said(in_force.reason, in_force.since_ns)


def placement_refusal(cordon: Cordon, in_force: InForce = None) -> str | None:
    """Why a new placement is refused (None: it is taken), saying since when and
    why when the cordon event in force is given."""
    if cordon is Cordon.NONE:
        return None
    return (
        f"the node is {cordon}{_said(in_force)}: it takes no new placements "
        "(nothing recorded); place it on another node, or uncordon this one "
        "(POST /v1/node/uncordon)"
    )


def start_refusal(cordon: Cordon, instance_id: str, by_controller: bool) -> str | None:
    """Why a start is refused (None: it may start): a drained node starts none
    of its controllers' instances until it is uncordoned."""
    if cordon is not Cordon.DRAINED or not by_controller:
        return None
    return (
        f"the node is drained: {instance_id} (placed by a controller) stays stopped "
        "until the node is uncordoned (POST /v1/node/uncordon)"
    )
