"""The control API's bodies (msgspec types) and its error shape.

Every answer that changes state carries ``seq`` and ``hash``: the chain's
sequence number and BLAKE3 hash (hex) of the last event of the verb's
instance once the verb's events are durable, so a controller can check the
answer against the chain (``infervisor chain prove``) and resume a watch
from it. Errors are one shape, :class:`ErrorBody`, with a stable ``code``
(the command line's codes, docs/cli.md) and the HTTP status by meaning:

======  ==========================================================
400     the request or spec is malformed (``bad_request``, ``bad_spec``, ``bad_value``),
        or a header sent twice; ``field`` names what (``body``: the whole body)
401     no token, or a token the node does not know (``unauthorized``)
403     a socket peer of another uid, or a token whose scope does not cover the
        route (``forbidden``)
404     no such instance (``unknown_instance``)
409     the lifecycle state does not allow the verb, or the port is taken
        (``invalid_state``, ``refused``, ``port_taken``, ``idempotency_in_flight``),
        the node is cordoned (``cordoned``), a placement set is older than the
        controller's last (``stale_generation``)
422     admission refused, with the numbers (``admission_refused``, ``no_room``),
        or an idempotency key reused for another request (``idempotency_mismatch``)
415     a body not sent as ``Content-Type: application/json`` (``unsupported_media_type``)
500     the verb was accepted but its work failed (``spawn_failed``, ``node_error``)
502     the server did not answer a deep health check (``probe_failed``)
503     the node is starting or shutting down (``node_starting``, ``node_stopping``)
504     accepted and recorded, but not done in time (``timeout``)
======  ==========================================================
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from infervisor.adapters.spec import InstanceSpec
from infervisor.chain.records import EventHeader
from infervisor.replay.views import InstanceView

from .inventory import Inventory

__all__ = [
    "API_VERSION",
    "ErrorBody",
    "ErrorEnvelope",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "InstanceView",
    "NodeInfo",
    "PlaceAnswer",
    "PlaceRequest",
    "StopRequest",
    "TokenAnswer",
    "UnloadAnswer",
    "VerbAnswer",
    "VerbRequest",
    "WatchEvent",
]

#: The path prefix of every route; a breaking change gets a new one.
API_VERSION = "v1"

#: The chain's largest integer (its canonical form holds signed 64-bit integers).
INT64_MAX = 2**63 - 1
ControllerId = Annotated[
    str,
    msgspec.Meta(
        # Python's `$` also matches before a trailing newline (msgspec searches with `re`):
        # `(?!\n)` refuses one; the pattern means the same in ECMA-262 (JSON Schema).
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?!\n)$",
        description="The controller's node id (a plain token).",
    ),
]
Generation = Annotated[
    int,
    msgspec.Meta(
        ge=0, le=INT64_MAX, description="The controller's placement generation (0 to 2^63-1)."
    ),
]
Grace = Annotated[
    float, msgspec.Meta(ge=0, le=3600, description="Seconds from SIGTERM to SIGKILL.")
]


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class PlaceRequest(_Body, frozen=True):
    """Place an instance: the whole spec, and who places it at which generation.

    ``controller`` None places as the node itself (generation 0, no lease).
    """

    spec: InstanceSpec
    controller: ControllerId | None = None
    generation: Generation = 0
    start: bool = False


class VerbRequest(_Body, frozen=True):
    """A verb's optional body: ``controller`` names the controller asking.

    A controller's verb is recorded with the role ``controller`` (a controller
    start does not reset the restart budget; an operator's does) and renews
    that controller's lease like a heartbeat. Without it the caller is an operator.
    """

    controller: ControllerId | None = None


class StopRequest(VerbRequest, frozen=True):
    """Stop the server; ``grace_s`` None uses the node's ``stop_grace_s``."""

    grace_s: Grace | None = None


class HeartbeatRequest(_Body, frozen=True):
    """A controller is alive: renews its lease on the node."""

    controller: ControllerId


class VerbAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A verb's answer once its events are durable: the instance and the chain's head of it.

    ``evicted``: the instances the node evicted to make room for this start (a
    start or restart that did not fit the memory budget: ``residency.evicted``
    events naming it), in the order recorded; empty for the other verbs."""

    instance: InstanceView
    seq: int
    hash: str
    evicted: list[str] = msgspec.field(default_factory=list)


class PlaceAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What a placement did: ``applied``, ``unchanged`` or ``ignored`` (a stale generation).

    With ``start``, ``started`` says whether the start was done; a start refused
    after a placement that was recorded is ``start_error`` (the placement stands:
    the answer is still 200, and a retry places ``unchanged``). ``evicted``: the
    instances evicted to make room for the start (as a start's answer's).
    """

    instance_id: str
    outcome: str
    generation: int
    instance: InstanceView
    seq: int
    hash: str
    started: bool = False
    start_error: ErrorBody | None = None
    evicted: list[str] = msgspec.field(default_factory=list)


class UnloadAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The instance is forgotten; ``seq``/``hash`` are its ``instance.unloaded`` event."""

    instance_id: str
    seq: int
    hash: str


class TokenAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A deep health check's one generated token."""

    instance_id: str
    token: str


class HeartbeatAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The lease the heartbeat renewed (``lease_s`` None: the node keeps no lease).

    ``lapsed``: this controller's lease had lapsed before this heartbeat.
    ``stopped``: the instances (ids, sorted) that lapse of its lease stopped and
    nothing started since, read from the chain (so a node restart answers the
    same): the controller decides whether to start them again; the node does not.
    """

    controller: str
    lease_s: float | None
    lapsed: bool
    stopped: list[str]


class WitnessInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One configured witness (``[[witnesses]]``) as the node sees it.

    ``cosigned_size`` is the largest tree size of this chain it has cosigned
    (verified and stored; 0: none), ``checkpoint_size`` the node's latest
    checkpoint, ``behind_events`` the difference; ``last_error`` its last
    failure (null after a success), ``last_success_ns`` when it last cosigned
    in this run (ns since the epoch, UTC; null: not yet).
    """

    witness: str
    url: str
    cosigned_size: int
    checkpoint_size: int
    behind_events: int
    last_error: str | None = None
    last_success_ns: int | None = None


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The node: its id, version, phase (``open``, ``stopping``) and chain head.

    ``chain_writable`` is false while the chain refuses writes (disk full,
    write lock held by another process): ``chain_error`` says why and
    ``chain_failing_since_ns`` since when (ns since the epoch, UTC); the
    instances' observations wait, in order, and verbs are refused until it
    takes writes again. ``chain_append_failures`` counts failed append
    transactions since the node started.

    ``containment`` is how managed servers are contained (``cgroup2``,
    ``cgroup1`` or ``pgroup``), ``containment_reason`` why (the hierarchy
    used, or why none could be), ``memory_cgroup`` where memory limits go
    (None: nowhere); see docs/process-supervision.md.

    ``inventory`` is what the node has to place on: CPUs, memory, GPUs,
    adapters, ports and its memory budget (:class:`~.inventory.Inventory`).

    ``witnesses`` are the witnesses of ``[[witnesses]]`` and how far each is
    behind (C2SP tlog-witness; empty without), ``witness_quorum`` how many must
    cosign a checkpoint.
    """

    node_id: str
    version: str
    phase: str
    head_seq: int
    head_hash: str
    instances: int
    lease_s: float | None
    chain_writable: bool = True
    chain_error: str | None = None
    chain_failing_since_ns: int | None = None
    chain_append_failures: int = 0
    containment: str = ""
    containment_reason: str = ""
    memory_cgroup: str | None = None
    inventory: Inventory | None = None
    witnesses: list[WitnessInfo] = msgspec.field(default_factory=list)
    witness_quorum: int | None = None
    #: Whether the node takes placements: ``none``, ``cordoned`` (no new
    #: placements) or ``drained`` (also its controllers' instances stopped).
    cordon: str = "none"
    #: The reason recorded with the cordon or drain in force (null: none given,
    #: or the node is not cordoned).
    cordon_reason: str | None = None
    #: When the cordon or drain in force was recorded: its event's time, ns since
    #: the epoch, UTC (null: the node is not cordoned).
    cordon_since_ns: int | None = None


class WatchEvent(EventHeader, frozen=True, kw_only=True, gc=True):
    """One chain event as the watch stream sends it (the SSE ``data`` line).

    ``payload`` is the event's canonical payload, decoded; ``hash`` and
    ``prev_hash`` are hex. The SSE ``id`` is ``seq``: reconnect with
    ``Last-Event-ID`` (or ``?from_seq=seq+1``) to resume after it.
    """

    payload: dict[str, object]
    hash: str
    prev_hash: str


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """What is wrong: a stable ``code``, the ``field`` at fault (or None) and what to do."""

    code: str
    message: str
    field: str | None = None


class ErrorEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """Every error answer: ``{"error": {...}}``, the same shape as the CLI's ``--json``."""

    error: ErrorBody
