"""Typed messages between the node's actors (the status view they answer with,
:class:`~infervisor.replay.views.InstanceView`, is in :mod:`infervisor.replay.views`).

Verbs (asked, answered once their event is durable): :class:`Start`,
:class:`Stop`, :class:`Restart`, :class:`Unload`, :class:`GetStatus`.
Ticks and observations (told): :class:`HealthTick`, :class:`ReconcileTick`,
:class:`Boot` and the private ones the instance actor sends itself.
Host messages (asked; the host never waits): :class:`Place`, :class:`Admit`,
:class:`UnloadInstance` and :class:`BootAll` answer a
``concurrent.futures.Future`` at once, resolved when the work is done.
"""

from __future__ import annotations

from typing import Any

import msgspec

from infervisor.adapters.ports import ListenerSnapshot
from infervisor.adapters.proc.table import ProcessTable
from infervisor.adapters.spec import InstanceSpec
from infervisor.chain import EventDraft
from infervisor.replay import NodeState

__all__ = [
    "Admit",
    "Append",
    "AwaitReady",
    "AwaitStopped",
    "Boot",
    "BootAll",
    "DeepHealth",
    "Deregister",
    "GetStatus",
    "HealthTick",
    "Heard",
    "InstanceGone",
    "IsSettled",
    "LeaseExpired",
    "ListInstances",
    "Lookup",
    "NewPlacement",
    "Place",
    "PlaceMany",
    "ReconcileTick",
    "Register",
    "ResidencyFacts",
    "Restart",
    "Revive",
    "ShuttingDown",
    "Start",
    "Stop",
    "Unload",
    "UnloadInstance",
    "WatchedBy",
]


class _Msg(msgspec.Struct, frozen=True, kw_only=True):
    pass


# Chain writer
class Append(_Msg, frozen=True):
    """Append drafts in one transaction; answers the stored events once durable."""

    drafts: tuple[EventDraft, ...]


# Verbs to an instance
class Start(_Msg, frozen=True):
    """Start the server. ``by="operator"`` resets the restart budget. ``room``: a
    start that does not fit is answered ``BudgetExceeded`` unrecorded, for the
    node to make room (actors/node_residency.py)."""

    by: str = "operator"
    room: bool = False


class Stop(_Msg, frozen=True):
    """Stop the server (``grace_s`` seconds after SIGTERM before SIGKILL). Answers a Future."""

    by: str = "operator"
    grace_s: float | None = None
    reason: str = ""


class Restart(_Msg, frozen=True):
    """Stop (when running), then start; an operator restart resets the budget.
    ``room``: as :class:`Start`'s."""

    by: str = "operator"
    room: bool = False


class Unload(_Msg, frozen=True):
    """Stop the server and forget the instance."""

    by: str = "operator"


class DeepHealth(_Msg, frozen=True):
    """Probe plus one real token (costs compute; separate from status). Answers a Future."""


class ResidencyFacts(_Msg, frozen=True):
    """Answer what an eviction weighs of the instance (``core.room.Holder``).
    ``sizing``: its ``needs_bytes`` are what a start of it would reserve now (an
    Ollama model's size read from Ollama, blocking the actor up to the probe
    timeout), for the room plan of its start; else the registry's size."""

    sizing: bool = False


class AwaitReady(_Msg, frozen=True):
    """Answer a Future resolved with the instance's view once it is running, or
    once it will not be by itself (stopped, resting, failed, unloaded)."""


class AwaitStopped(_Msg, frozen=True):
    """Answer a Future resolved with the instance's view once nothing of its
    server is left (a stop in flight has ended)."""


class GetStatus(_Msg, frozen=True):
    """Answer an :class:`InstanceView` from what the actor already knows (never probes)."""


class IsSettled(_Msg, frozen=True):
    """Answer True when no probe or termination of this instance is in flight."""


class ShuttingDown(_Msg, frozen=True):
    """To the supervisor: the node is shutting down; the controller lease is no
    longer judged (a lease lapsing while the servers stop must not record them
    stopped by the lease: they stay wanted as they were for the next start)."""


class NewPlacement(_Msg, frozen=True):
    """The instance was placed again: a newer generation is applied, an older
    one is ignored; both are recorded. Answers True when applied."""

    placed_by: str
    generation: int
    by: str = "controller"  # the placement's source: who asked (replay/callers.py)


class LeaseExpired(_Msg, frozen=True):
    """``controller`` has not been heard for ``silent_s`` seconds (longer than the
    lease); told only to the instances it placed."""

    silent_s: float
    controller: str


# Ticks and boot
class HealthTick(_Msg, frozen=True):
    """Send the checks due now: a deep check, and the probe loop's next probe at once.

    The probe loop (actors/probe_loop.py) paces the probes itself and wakes the
    actor only when the core's wake rule says so (actors/core/wake.py); this
    message is the manual kick, not the supervisor's beat.

    Exposure is checked on the reconcile tick, not here: a socket-table read with
    owners costs about 20 ms of CPU with a hundred processes, too much for every
    health interval.
    """


class ReconcileTick(_Msg, frozen=True):
    """Compare desired and actual state and act toward desired.

    ``listeners``: one snapshot of the sockets listening beyond loopback on
    this machine, with their owning pids, read once for every instance
    (:func:`~infervisor.adapters.ports.listener_snapshot`; None when the socket
    table could not be read). ``processes``: the tick's one read of the process
    table (:class:`~infervisor.adapters.proc.table.ProcessTable`), from which
    each instance tracks its server's descendants and tree RSS.
    """

    listeners: ListenerSnapshot | dict[int, list[str]] | None = None
    processes: ProcessTable | None = None


class Boot(_Msg, frozen=True):
    """The node restarted: find recorded processes again and resume desired state
    (``held``: start nothing of it again: the node is drained)."""

    held: bool = False


# Host
class Place(_Msg, frozen=True):
    """Admit an instance. Answers a ``concurrent.futures.Future[str]`` at once (or
    raises a refusal found at once); it resolves to the instance id once the
    placement is durable and the instance routed, or to the refusal. A second
    placement of an id whose placement is still in flight is refused
    (``InvalidState``)."""

    spec: InstanceSpec
    placed_by: str
    generation: int = 0
    source: str = "operator"


class InstanceGone(_Msg, frozen=True):
    """An instance's own decision recorded it unloaded (a boot finishing an unload
    that the last node began): the host forgets it, as after an unload it asked."""

    instance_id: str


class PlaceMany(_Msg, frozen=True):
    """Admit a batch: answers at once a list, in order, of each placement's
    ``concurrent.futures.Future[Placement]`` or the refusal found at once. The
    new instances' admissions run side by side and their events are appended
    in one transaction; a placement of an instance already here goes as
    :class:`Place` would."""

    placements: tuple[Place, ...]
    #: Events recorded in the batch's transaction before its placements (a
    #: controller's ``node.placement_set``): ``actors.append.Entry`` tuples.
    lead: tuple[Any, ...] = ()
    #: All or nothing: one placement refused refuses them all and records nothing.
    whole: bool = False


class Admit(_Msg, frozen=True):
    """Run admission only (nothing is placed or recorded). Answers a
    ``concurrent.futures.Future[Admission]`` at once."""

    spec: InstanceSpec


class Lookup(_Msg, frozen=True):
    """Answer the instance actor's ref from the published routes (raises
    UnknownInstance, or InvalidState while it is being unloaded). The node reads
    the routes itself; this is for other askers."""

    instance_id: str


class ListInstances(_Msg, frozen=True):
    """Answer ``{instance_id: ref}`` of every routed instance (not those being unloaded)."""


class UnloadInstance(_Msg, frozen=True):
    """Unload and end the instance's actor. Answers a ``concurrent.futures.Future[None]``
    at once (raises UnknownInstance at once); it resolves once ``instance.unloaded``
    is durable and the actor is ended, or to the unload's error (the instance is
    then routed again). From the ask on, no verb is routed to the instance; a
    second unload while one is in flight answers the same Future."""

    instance_id: str
    by: str = "operator"


class BootAll(_Msg, frozen=True):
    """Create an actor per instance of the rebuilt state and boot each. Answers a
    ``concurrent.futures.Future[list[str]]`` at once: the ids booted, once all are.
    ``hold``: the ids booted held (nothing of them started again: a drained node)."""

    state: NodeState
    hold: frozenset[str] = frozenset()


# Supervisor
class Heard(_Msg, frozen=True):
    """A controller other than this node was heard from (a heartbeat or a verb).
    Asked, it answers whether that controller's lease had lapsed before."""

    controller: str


class WatchedBy(_Msg, frozen=True):
    """The host to tell when an instance actor is found dead."""

    host: Any


class Revive(_Msg, frozen=True):
    """An instance actor died: recreate it from the chain (replayed off the host's
    thread) and re-attach its process. Ignored for an instance unloaded or being
    unloaded meanwhile, or whose actor is alive again."""

    instance_id: str


class Register(_Msg, frozen=True):
    """Send this instance ticks; ``placed_by`` (its placement's controller, or this
    node) says whose lease it is under. Sent again when a placement changes it."""

    instance_id: str
    ref: Any
    placed_by: str = ""


class Deregister(_Msg, frozen=True):
    """Stop sending this instance ticks."""

    instance_id: str
