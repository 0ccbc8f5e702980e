"""The typed, versioned events of the chain, and their codec.

Every event is a frozen msgspec Struct tagged with its chain ``kind``; the
payload stored in the chain is the canonical JSON of the struct (keys sorted,
so the bytes are a function of the value). ``v`` is the payload version: when
a shape changes, the old one is upgraded on read by :data:`UPCASTERS`, because
the chain is forever and replay must read every event it ever stored.

The instance spec travels as a plain mapping: ``replay`` does not depend on
``adapters``, and it never needs more of a spec than it stores.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from infervisor.chain import StoredEvent, encode_payload

from .event_base import EventBase
from .fleet_events import NodeCordoned, NodeDrained, NodeUncordoned, PlacementSet
from .node_events import (
    AdmissionRefused,
    KeyRotated,
    LeaseRenewed,
    NodeStarted,
    NodeStopped,
    NodeStraysEnded,
    WitnessOverride,
)
from .residency_events import (
    ResidencyBusy,
    ResidencyDemanded,
    ResidencyEvicted,
    ResidencyExpired,
    ResidencyIdle,
    ResidencyRefused,
)
from .state import Stamp, Then
from .upcast import UPCASTERS, EventDecodeError, upcast

__all__ = [
    "EVENT_TYPES",
    "UPCASTERS",
    "AdmissionRefused",
    "DeepHealthFailed",
    "Event",
    "EventDecodeError",
    "Exited",
    "Exposed",
    "Failed",
    "Finished",
    "InstanceEvent",
    "KeyRotated",
    "LeaseRenewed",
    "MemoryCorrected",
    "MemoryReleased",
    "ModelClaimed",
    "ModelDropped",
    "NodeCordoned",
    "NodeDrained",
    "NodeStarted",
    "NodeStopped",
    "NodeStraysEnded",
    "NodeUncordoned",
    "Placed",
    "PlacementIgnored",
    "PlacementSet",
    "Ready",
    "Reattached",
    "Recovered",
    "Replaced",
    "RestartScheduled",
    "Spawned",
    "StableAgain",
    "StartRefused",
    "Starting",
    "StopRequested",
    "StraysEnded",
    "Terminating",
    "Unhealthy",
    "UnloadFailed",
    "Unloaded",
    "WitnessOverride",
    "decode_event",
    "encode_event",
    "kind_of",
]


class Placed(EventBase, frozen=True, tag="instance.placed"):
    """An instance was admitted. ``generation`` orders placements by a controller."""

    spec: dict[str, Any]
    placed_by: str
    generation: int = 0


class Replaced(EventBase, frozen=True, tag="instance.replaced"):
    """A newer placement (higher generation) of an instance already placed."""

    placed_by: str
    generation: int


class PlacementIgnored(EventBase, frozen=True, tag="instance.placement_ignored"):
    """A stale placement (generation older than the one applied) was ignored."""

    placed_by: str
    generation: int
    current: int


class Starting(EventBase, frozen=True, tag="instance.starting"):
    """A start was decided (before anything is spawned or loaded).

    ``by`` is ``operator``, ``controller``, ``boot`` or ``supervisor``; an
    explicit operator start resets the restart budget (``reset_budget``).
    ``reserved_bytes`` is what the residency ledger set aside for it.
    """

    by: str
    reset_budget: bool = False
    attempt: int = 0
    reserved_bytes: int = 0
    launch_token: str = ""
    at: Stamp | None = None


class Spawned(EventBase, frozen=True, tag="instance.spawned"):
    """The server process exists. Identity: pid, process group, start time (s), boot id."""

    pid: int
    pgid: int
    start_time: float
    boot_id: str
    argv: list[str]
    at: Stamp | None = None


class Reattached(EventBase, frozen=True, tag="instance.reattached"):
    """After a node restart, the recorded server process was found still running
    (same pid, start time and boot id) and is supervised again, without a restart.
    ``up_since``: when that process started (for the stability period)."""

    pid: int
    up_since: Stamp | None = None


class StartRefused(EventBase, frozen=True, tag="instance.start_refused"):
    """A start was refused before anything was spawned (port taken, ...). No state change."""

    by: str
    reason: str


class Ready(EventBase, frozen=True, tag="instance.ready"):
    """The server answered its health probe: it is serving (since ``at``)."""

    detail: str = ""
    at: Stamp | None = None


class Unhealthy(EventBase, frozen=True, tag="instance.unhealthy"):
    """Consecutive health misses reached the limit."""

    misses: int
    reason: str


class DeepHealthFailed(EventBase, frozen=True, tag="instance.deep_health_failed"):
    """A scheduled deep health check (one real token) failed: the health endpoint
    may still answer. ``misses``: consecutive failed deep checks (``miss_limit``
    of them make the instance unhealthy). No state change."""

    misses: int
    reason: str


class Recovered(EventBase, frozen=True, tag="instance.recovered"):
    """An unhealthy server answered again."""

    detail: str = ""


class Exited(EventBase, frozen=True, tag="instance.exited"):
    """The server process is gone (its whole group). Code or signal, and an output tail.

    While stopping this completes the stop; while restarting it only clears the
    process; otherwise the instance is ``exited``.
    """

    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str
    output_tail: str = ""
    #: The kernel's OOM killer killed in the server's cgroup (its ``oom_kill``
    #: count rose), under the limit ``memory_max_bytes``.
    oom_killed: bool = False
    memory_max_bytes: int | None = None


class RestartScheduled(EventBase, frozen=True, tag="instance.restart_scheduled"):
    """A restart was decided; it runs after ``delay_s`` seconds of backoff.

    ``at`` is when it was decided and ``due`` when it falls due: a node that
    boots during the backoff waits out what is left of it.
    """

    attempt: int
    delay_s: float
    reason: str
    at: Stamp | None = None
    due: Stamp | None = None


class Failed(EventBase, frozen=True, tag="instance.failed"):
    """The restart budget is spent: held for the operator."""

    attempts: int
    reason: str


class Finished(EventBase, frozen=True, tag="instance.finished"):
    """A one-shot run ended cleanly (exit 0): never restarted, also after a node restart."""

    exit_code: int = 0


class StableAgain(EventBase, frozen=True, tag="instance.stable"):
    """Up for the stability period: the restart count clears."""

    uptime_s: float


class StopRequested(EventBase, frozen=True, tag="instance.stop_requested"):
    """A stop was decided. ``by="shutdown"`` keeps the instance wanted running.

    ``then`` says what follows once the server is gone: ``restart`` (an
    operator restart: it stays wanted running), ``unload``, or nothing. ``at``
    is when SIGTERM was sent; SIGKILL is due ``grace_s`` later.
    """

    by: str
    grace_s: float
    reason: str = ""
    then: Then = Then.NOTHING
    at: Stamp | None = None


class Terminating(EventBase, frozen=True, tag="instance.terminating"):
    """The supervisor is ending the server (a health kill): SIGTERM sent at
    ``at``, SIGKILL due ``grace_s`` later. The instance stays wanted running;
    the exit that follows goes through the restart policy."""

    cause: str
    grace_s: float
    at: Stamp


class ModelClaimed(EventBase, frozen=True, tag="instance.model_claimed"):
    """Ollama: whether this node loads the model (``ours``: only then may it
    unload it). Recorded before the load request is sent."""

    ours: bool


class ModelDropped(EventBase, frozen=True, tag="instance.model_dropped"):
    """Ollama no longer lists the model (``/api/ps``) although the instance was
    running: its keep_alive ran out (``expired``) or Ollama dropped it earlier
    (evicted, restarted). ``expires_at_ns``: the expiry Ollama last reported
    (ns since the epoch, UTC; None: none seen). Nothing of it is ours in Ollama
    any more; the exit recorded with it goes through the restart policy."""

    expired: bool
    expires_at_ns: int | None = None


class MemoryCorrected(EventBase, frozen=True, tag="instance.memory_corrected"):
    """Ollama reports the loaded model takes more than was reserved: the
    reservation becomes ``reserved_bytes`` (what Ollama reports plus the node's
    overhead). ``size_bytes``/``size_vram_bytes``: ``/api/ps`` ``size`` and
    ``size_vram``. Recorded even past the budget: the memory is already taken."""

    reserved_bytes: int
    size_bytes: int
    size_vram_bytes: int = 0


class MemoryReleased(EventBase, frozen=True, tag="instance.memory_released"):
    """The residency ledger gave back the instance's reservation (the model is
    confirmed gone from memory)."""

    bytes: int


class UnloadFailed(EventBase, frozen=True, tag="instance.unload_failed"):
    """Ollama did not unload this node's model when a stop asked it to (``error``:
    its answer, or why none came). The model may still be resident: it stays
    this node's, and so does its reservation, but no unload is in flight any
    more, so a start may proceed (it finds the model resident) and another
    stop asks Ollama again."""

    error: str


class Exposed(EventBase, frozen=True, tag="instance.exposed"):
    """A managed server was found listening beyond loopback: it is stopped and
    will not start again until the instance is reloaded."""

    addresses: list[str]


class StraysEnded(EventBase, frozen=True, tag="instance.strays_ended"):
    """At boot, processes were found in the instance's cgroup (the kernel's
    membership, ``docs/process-supervision.md``) that no record claims (the
    server they belonged to is gone, or was never recorded): they are killed.
    ``pids`` are theirs; ``cgroup`` is where they were found."""

    pids: list[int]
    cgroup: str


class Unloaded(EventBase, frozen=True, tag="instance.unloaded"):
    """The instance is forgotten."""

    by: str


InstanceEvent = (
    Placed
    | Replaced
    | PlacementIgnored
    | Starting
    | Spawned
    | Reattached
    | StartRefused
    | Ready
    | Unhealthy
    | Recovered
    | DeepHealthFailed
    | Exited
    | RestartScheduled
    | Failed
    | Finished
    | StableAgain
    | StopRequested
    | Terminating
    | ModelClaimed
    | ModelDropped
    | MemoryCorrected
    | MemoryReleased
    | UnloadFailed
    | Exposed
    | StraysEnded
    | Unloaded
    | ResidencyDemanded
    | ResidencyEvicted
    | ResidencyExpired
    | ResidencyRefused
    | ResidencyBusy
    | ResidencyIdle
)
Event = (
    NodeStarted
    | NodeStopped
    | NodeStraysEnded
    | KeyRotated
    | WitnessOverride
    | AdmissionRefused
    | LeaseRenewed
    | NodeCordoned
    | NodeDrained
    | NodeUncordoned
    | PlacementSet
    | InstanceEvent
)

EVENT_TYPES: dict[str, type[Any]] = {t.__struct_config__.tag: t for t in get_args(Event)}

_DECODER = msgspec.json.Decoder(Event)
_TAGS: dict[type[Any], str] = {t: tag for tag, t in EVENT_TYPES.items()}
_RAW = msgspec.json.Decoder(dict[str, Any])


def kind_of(event: Event) -> str:
    """The chain ``kind`` of an event: its tag."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def encode_event(event: Event) -> bytes:
    """Canonical payload bytes (sorted keys) of an event."""
    return encode_payload(event)


def decode_event(stored: StoredEvent) -> Event:
    """Decode a stored payload into its typed event, upcasting older versions.

    Raises:
        EventDecodeError: unknown kind, a payload tag that disagrees with the
            header kind, or a payload that does not fit its type.
    """
    kind = stored.kind
    if kind not in EVENT_TYPES:
        raise EventDecodeError(
            f"seq {stored.seq}: unknown event kind {kind!r}", seq=stored.seq, kind=stored.kind
        )
    try:  # the common case in one typed decode: a current payload of the header's kind
        fast: Event = _DECODER.decode(stored.payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass  # the careful path below names the problem, or upcasts
    else:
        if fast.v == 1 and _TAGS[type(fast)] == kind:
            return fast
    try:
        raw = _RAW.decode(stored.payload)
        if raw.get("v", 1) != 1 or raw.get("event") != stored.kind:
            upgraded: Event = upcast(stored, raw, Event)
            return upgraded
        event: Event = _DECODER.decode(stored.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise EventDecodeError(
            f"seq {stored.seq} ({stored.kind}): {e}", seq=stored.seq, kind=stored.kind
        ) from e
    return event
